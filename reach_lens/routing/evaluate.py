"""Graded candidates of (question, route) pairs, memoized, and the reward function that drives searches.

    ev = RouteEvaluator(model, task, questions, "native")
    searches = [MCTS(make_space("skip_repeat", L), K=64, seed=s) for s in seeds]   # one per question
    traces = run_searches(searches, ev.reward_fn(question_of=list(range(len(questions)))))
    cand = ev.candidate(0, traces[0].routes[0])      # the full path's (greedy, unmodified) candidate

A candidate is a `records.candidate` dict: `text`, `answer`, `correct` (`task.grade`), `mean_logprob`, `length`,
`entropy`, `finish_reason`, `route` (list of layers) and `hidden` (the residual entering ln_final where the last
token was produced, when `keep_hidden`).

`learned_router_outcomes` grades the cross-fitted learned router's route of every question, generating only
routes whose correctness is not already known and keeping them in a run store.

Every (question, route) pair is generated once per evaluator, whichever search or action space asks for it,
so searches that share routes (all share the full path) share the cost. Rows of one call go through
`probes.route` together: different questions and routes share decode batches and prompt prefixes.
"""
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Optional, Sequence

from transformer_lens import HookedTransformer

from reach_lens.hooks import validate_route
from reach_lens.probes import prompt_ids, route
from reach_lens.routing.router import cross_fit_router
from reach_lens.routing.search import BatchRewardFn
from reach_lens.routing.spaces import Path
from reach_lens.store import RunStore
from reach_lens.tasks import Question, Task


class RouteEvaluator:
    """Greedy candidates of `questions` under routes, in prompt format `fmt`, memoized per (question index, route)."""

    def __init__(self, model: HookedTransformer, task: Task, questions: Sequence[Question], fmt: str,
                 batch_size: int = 16, keep_hidden: bool = True):
        self.model, self.task, self.questions, self.fmt = model, task, list(questions), fmt
        self.batch_size, self.keep_hidden = batch_size, keep_hidden
        self.memo: dict[tuple[int, Path], dict] = {}

    def evaluate(self, pairs: Sequence[tuple[int, Sequence[int]]]) -> list[dict]:
        """Candidates of (question index, route) pairs, generating the ones not seen before in one call."""
        n_layers = self.model.cfg.n_layers
        keys = [(int(i), validate_route(r, n_layers)) for i, r in pairs]
        bad = [i for i, _ in keys if not 0 <= i < len(self.questions)]
        if bad:
            raise ValueError(f"question index {bad[0]} out of range (0..{len(self.questions) - 1})")
        new = list(dict.fromkeys(k for k in keys if k not in self.memo))
        if new:
            by_question: dict[int, list[Path]] = {}
            for i, r in new:
                by_question.setdefault(i, []).append(r)
            asked = list(by_question)
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
        def reward(pairs: list[tuple[int, Path]]) -> list[float]:
            return [float(c["correct"]) for c in self.evaluate([(question_of[s], p) for s, p in pairs])]
        return reward


@dataclass
class RouterCell:
    """One cell (e.g. a task) of `learned_router_outcomes`: its questions, the (route, reward) pairs searched
    on each (training data, by question id), the correctness of routes already generated
    (`known[(question id, route)]`, default: from `found`), and the store whose `router` table keeps the
    routes generated here."""

    task: Task
    questions: Sequence[Question]
    found: Mapping[str, Sequence[tuple[Path, float]]]
    store: RunStore
    known: Optional[Mapping[tuple[str, Path], bool]] = None


def learned_router_outcomes(model: HookedTransformer, cells: Mapping[Hashable, RouterCell], fmt: str, seed: int = 0,
                            batch_size: int = 32) -> dict[Hashable, dict[str, tuple[Path, bool]]]:
    """(predicted route, correct) per question of each cell, from a learned router cross-fitted over the
    questions of all cells pooled (`cross_fit_router`). A route whose correctness is known (from the cell,
    or from its store's `router` table) is not generated again; the others are generated greedily, graded,
    and appended to the `router` table, so a rerun generates nothing."""
    known: dict[tuple[Hashable, str, Path], bool] = {}
    for key, cell in cells.items():
        given = cell.known if cell.known is not None else {
            (qid, tuple(r)): float(w) >= 1.0 for qid, pairs in cell.found.items() for r, w in pairs}
        known.update({(key, qid, tuple(r)): bool(c) for (qid, r), c in given.items()})
        stored = cell.store.read("router", key=None)
        if len(stored):
            known.update({(key, qid, tuple(r)): bool(c)
                          for qid, r, c in zip(stored.question_id, stored.route, stored.correct)})
    predicted = cross_fit_router(
        model, {key: (prompt_ids(model, c.task, c.questions, fmt), [q.id for q in c.questions]) for key, c in cells.items()},
        {(key, qid): pairs for key, c in cells.items() for qid, pairs in c.found.items()}, seed=seed)
    out = {}
    for key, cell in cells.items():
        route_of = {q.id: predicted[(key, q.id)] for q in cell.questions}
        todo = [(i, route_of[q.id]) for i, q in enumerate(cell.questions) if (key, q.id, route_of[q.id]) not in known]
        if todo:
            ev = RouteEvaluator(model, cell.task, cell.questions, fmt, batch_size=batch_size, keep_hidden=False)
            rows = [{"question_id": cell.questions[i].id, **{k: v for k, v in c.items() if k != "hidden"}}
                    for (i, _), c in zip(todo, ev.evaluate(todo))]
            cell.store.append("router", rows)
            known.update({(key, r["question_id"], tuple(r["route"])): r["correct"] for r in rows})
        out[key] = {qid: (route, known[(key, qid, route)]) for qid, route in route_of.items()}
    return out
