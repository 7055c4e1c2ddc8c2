"""Graded candidates of (question, route) pairs, memoized, and the reward function that drives searches.

    ev = RouteEvaluator(model, task, questions, "native")
    searches = [MCTS(make_space("skip_repeat", L), K=64, seed=s) for s in seeds]   # one per question
    traces = run_searches(searches, ev.reward_fn(question_of=list(range(len(questions)))))
    cand = ev.candidate(0, traces[0].routes[0])      # the full path's (greedy, unmodified) candidate

A candidate is a `records.candidate` dict: `text`, `answer`, `correct` (`task.grade`), `mean_logprob`, `length`,
`entropy`, `finish_reason`, `route` (list of layers) and `hidden` (the residual entering ln_final where the last
token was produced, when `keep_hidden`).

Rows for the studies (library functions return rows; the experiments store them):
- `search_rows`: every (action space, method) search of a chunk of questions, one row per question;
- `random_route_candidates`: the random search's candidates of each question (selection's route probe);
- `router_routes` (the cross-fitted learned router's route per question) and `router_rows` (its greedy answer
  per question, generating only routes whose candidate is not already known); `LearnedRouter` composes the
  two over the cells of one model, fitting only when a row is asked for.

Every (question, route) pair is generated once per evaluator, whichever search or action space asks for it,
so searches that share routes (all share the full path) share the cost. The new routes of one call go through
`probes.route` in engine calls of at most `ROUTES_PER_CALL` routes (a question's routes together): different
questions and routes share decode batches and prompt prefixes, and memory stays bounded.
"""
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from transformer_lens import HookedTransformer

from reach_lens.routes import LayerRoute, validate_route
from reach_lens.probes import prompt_ids, question_seed, route
from reach_lens.routing.local import Genetic, HillClimb, RandomSearch, random_method
from reach_lens.routing.mcts import MCTS
from reach_lens.routing.router import cross_fit_router
from reach_lens.routing.search import BatchRewardFn, Search, run_searches
from reach_lens.routing.spaces import ActionSpace, make_space
from reach_lens.tasks import Question, Task


# routes generated per engine call: a call keeps the prefilled keys and values of the routes of every prompt it has
# started until their rows start, so a call of 15 SQuAD questions x 64 random routes held ~12 GB; calls of 256 routes
# keep it to a few prompts' worth and still fill decode batches
ROUTES_PER_CALL = 256


class RouteEvaluator:
    """Greedy candidates of `questions` under routes, in prompt format `fmt`, memoized per (question index, route)."""

    def __init__(self, model: HookedTransformer, task: Task, questions: Sequence[Question], fmt: str,
                 batch_size: int = 16, keep_hidden: bool = True):
        self.model, self.task, self.questions, self.fmt = model, task, list(questions), fmt
        self.batch_size, self.keep_hidden = batch_size, keep_hidden
        self.memo: dict[tuple[int, LayerRoute], dict] = {}

    def evaluate(self, pairs: Sequence[tuple[int, Sequence[int]]]) -> list[dict]:
        """Candidates of (question index, route) pairs, generating the ones not seen before in one call."""
        n_layers = self.model.cfg.n_layers
        keys = [(int(i), validate_route(r, n_layers)) for i, r in pairs]
        bad = [i for i, _ in keys if not 0 <= i < len(self.questions)]
        if bad:
            raise ValueError(f"question index {bad[0]} out of range (0..{len(self.questions) - 1})")
        by_question: dict[int, list[LayerRoute]] = {}
        for i, r in dict.fromkeys(k for k in keys if k not in self.memo):
            by_question.setdefault(i, []).append(r)
        for asked in _calls(by_question, ROUTES_PER_CALL):
            cands = route(self.model, self.task, [self.questions[i] for i in asked], self.fmt,
                          [by_question[i] for i in asked], batch_size=self.batch_size, keep_hidden=self.keep_hidden)
            for i, cs in zip(asked, cands):
                for r, c in zip(by_question[i], cs):
                    self.memo[(i, r)] = c
        return [self.memo[k] for k in keys]

    def candidate(self, question: int, route: Sequence[int]) -> dict:
        return self.evaluate([(question, route)])[0]

    def reward_fn(self, question_of: Sequence[int]) -> BatchRewardFn:
        """Reward (1.0 correct, 0.0 not) for `run_searches`, whose search i works on question `question_of[i]`."""
        def reward(pairs: list[tuple[int, LayerRoute]]) -> list[float]:
            return [float(c["correct"]) for c in self.evaluate([(question_of[s], p) for s, p in pairs])]
        return reward


def _calls(by_question: Mapping[int, Sequence[LayerRoute]], limit: int) -> list[list[int]]:
    """Questions in order, grouped into engine calls of at most ``limit`` routes (a question's routes stay in one
    call; a question with more routes than ``limit`` is a call of its own)."""
    calls: list[list[int]] = []
    size = 0
    for i, routes in by_question.items():
        if not calls or size + len(routes) > limit:
            calls.append([])
            size = 0
        calls[-1].append(i)
        size += len(routes)
    return calls


METHODS: dict[str, type[Search]] = {cls.name: cls for cls in (RandomSearch, MCTS, HillClimb, Genetic)}


def make_search(method: str, space: ActionSpace, K: int, seed: int, random_routes: str = "geometric",
                mcts_batch: int = 1) -> Search:
    """A search of `method` ("random", "mcts", "hill_climb", "genetic") over `space` with budget K; `random_routes`
    is the law of the random search's routes ("geometric" or "uniform"), `mcts_batch` the routes MCTS asks per
    round (virtual loss; 1: the sequential search); the other methods ignore them."""
    if method not in METHODS:
        raise ValueError(f"search method {method!r} unknown; valid: {', '.join(map(repr, METHODS))}")
    if method == "random":
        return RandomSearch(space, K, seed, law=random_routes)
    if method == "mcts":
        return MCTS(space, K, seed, batch=mcts_batch)
    return METHODS[method](space, K, seed)


def search_rows(model: HookedTransformer, task: Task, questions: Sequence[Question], fmt: str, spaces: Sequence[str],
                methods: Sequence[str], K: int, seed: int, random_routes: Sequence[str] = ("geometric",),
                batch_size: int = 16, mcts_batch: int = 1) -> list[dict]:
    """Every (action space, method) search of every question, in lockstep (shared decode batches); one row per
    question: ``question_id``, ``searches`` (per search: space, method, seed, routes, rewards, batch_sizes)
    and ``candidates`` (every distinct route generated for the question, as candidate dicts without hidden
    states). The method "random" runs once per law of ``random_routes``, as ``random_method(law)`` ("random",
    "random_uniform"); ``mcts_batch``: routes per MCTS round. Search seeds are
    ``question_seed(seed, "id|space|method")``."""
    ev = RouteEvaluator(model, task, questions, fmt, batch_size=batch_size, keep_hidden=False)
    runs = [(random_method(law), law) for law in dict.fromkeys(random_routes)] if "random" in methods else []
    runs = [*runs, *((m, None) for m in methods if m != "random")]
    searches, meta = [], []
    for i, q in enumerate(questions):
        for space in spaces:
            for name, law in runs:
                s = question_seed(seed, f"{q.id}|{space}|{name}")
                searches.append(make_search("random" if law else name, make_space(space, model.cfg.n_layers), K, s,
                                            law or "geometric", mcts_batch))
                meta.append((i, {"space": space, "method": name, "seed": s}))
    traces = run_searches(searches, ev.reward_fn([i for i, _ in meta]))
    rows = [{"question_id": q.id, "searches": [], "candidates": []} for q in questions]
    for (i, info), t in zip(meta, traces):
        rows[i]["searches"].append({**info, "routes": [list(r) for r in t.routes], "rewards": list(t.rewards),
                                    "batch_sizes": list(t.batch_sizes)})
    for (i, _), c in ev.memo.items():
        rows[i]["candidates"].append({k: v for k, v in c.items() if k != "hidden"})
    return rows


def random_route_candidates(model: HookedTransformer, task: Task, questions: Sequence[Question], fmt: str, space: str,
                            K: int, seed: int, random_routes: str = "geometric", batch_size: int = 16,
                            keep_hidden: bool = True) -> list[list[dict]]:
    """Per question, the greedy candidates of the full path and K-1 distinct random routes of `space` (the random
    search of `search_rows`, same seeds: the same routes as the routing study's random search)."""
    ev = RouteEvaluator(model, task, questions, fmt, batch_size=batch_size, keep_hidden=keep_hidden)
    name = random_method(random_routes)
    searches = [make_search("random", make_space(space, model.cfg.n_layers), K,
                            question_seed(seed, f"{q.id}|{space}|{name}"), random_routes) for q in questions]
    traces = run_searches(searches, ev.reward_fn(list(range(len(questions)))))
    return [[ev.candidate(i, r) for r in t.routes] for i, t in enumerate(traces)]


def router_routes(model: HookedTransformer, cells: Mapping[Hashable, tuple[Task, Sequence[Question], str]],
                  found: Mapping[Hashable, Mapping[str, Sequence[tuple[LayerRoute, float]]]],
                  seed: int = 0) -> dict[Hashable, dict[str, LayerRoute]]:
    """The learned router's route of every question of every cell (`cells[key] = (task, questions, fmt)`),
    cross-fitted over the questions of all cells pooled (`cross_fit_router`) and trained on the (route,
    reward) pairs searched on the other folds' questions (`found[key][question id]`)."""
    predicted = cross_fit_router(
        model, {key: (prompt_ids(model, task, qs, fmt), [q.id for q in qs]) for key, (task, qs, fmt) in cells.items()},
        {(key, qid): pairs for key, per_q in found.items() for qid, pairs in per_q.items()}, seed=seed)
    return {key: {q.id: predicted[(key, q.id)] for q in qs} for key, (_, qs, _) in cells.items()}


ROUTER_COLUMNS = ("question_id", "route", "answer", "correct", "generated")


def router_rows(model: HookedTransformer, task: Task, questions: Sequence[Question], fmt: str,
                route_of: Mapping[str, Sequence[int]], known: Mapping[tuple[str, LayerRoute], Mapping] | None = None,
                batch_size: int = 16) -> list[dict]:
    """One row per question (`ROUTER_COLUMNS`): its router route (`route_of[question id]`), the greedy answer
    under it and whether it is correct. A (question id, route) pair in `known` (candidate dicts, e.g. the
    search's) is read from there; the others are generated here (``generated`` True)."""
    known = known or {}
    routes = {q.id: tuple(int(layer) for layer in route_of[q.id]) for q in questions}
    todo = [q for q in questions if (q.id, routes[q.id]) not in known]
    made = {}
    if todo:
        cands = route(model, task, todo, fmt, [[routes[q.id]] for q in todo], batch_size=batch_size)
        made = {(q.id, routes[q.id]): cs[0] for q, cs in zip(todo, cands)}
    rows = []
    for q in questions:
        key = (q.id, routes[q.id])
        c = made.get(key) or known[key]
        rows.append({"question_id": q.id, "route": list(key[1]), "answer": c["answer"], "correct": bool(c["correct"]),
                     "generated": key in made})
    return rows


def known_candidates(candidates: Iterable[Sequence[Mapping]],
                     question_ids: Iterable[str]) -> dict[tuple[str, LayerRoute], Mapping]:
    """{(question id, route): candidate} from per-question candidate lists (each candidate with its ``route``)."""
    return {(qid, tuple(int(layer) for layer in c["route"])): c
            for qid, cands in zip(question_ids, candidates) for c in cands}


@dataclass
class RouterCell:
    """One cell (e.g. a task) of a `LearnedRouter`: its questions, the (route, reward) pairs searched on each
    (training data, by question id), the candidates already generated (`known_candidates`) and the prompt
    format they were generated in."""

    task: Task
    questions: Sequence[Question]
    found: Mapping[str, Sequence[tuple[LayerRoute, float]]]
    known: Mapping[tuple[str, LayerRoute], Mapping]
    fmt: str


class LearnedRouter:
    """`router_rows` of the questions of several cells, from one cross-fitted router over all of them
    (`router_routes`), fitted once, on the first call of `rows` (a rerun that finds every row stored fits nothing).

        router = LearnedRouter(model, {"arc_easy": RouterCell(task, questions, found, known, "native")})
        rows = router.rows("arc_easy", questions[:5])
    """

    def __init__(self, model: HookedTransformer, cells: Mapping[Hashable, RouterCell], seed: int = 0,
                 batch_size: int = 16):
        self.model, self.cells, self.seed, self.batch_size = model, dict(cells), seed, batch_size
        self._routes: dict[Hashable, dict[str, LayerRoute]] | None = None

    def routes(self) -> dict[Hashable, dict[str, LayerRoute]]:
        if self._routes is None:
            self._routes = router_routes(self.model, {k: (c.task, c.questions, c.fmt) for k, c in self.cells.items()},
                                         {k: c.found for k, c in self.cells.items()}, seed=self.seed)
        return self._routes

    def rows(self, key: Hashable, questions: Sequence[Question]) -> list[dict]:
        cell = self.cells[key]
        return router_rows(self.model, cell.task, questions, cell.fmt, self.routes()[key], cell.known, self.batch_size)
