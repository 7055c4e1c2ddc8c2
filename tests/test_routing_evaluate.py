"""Graded route candidates (RouteEvaluator), the rows the routing and selection studies store (search_rows,
random_route_candidates, router_rows, LearnedRouter) on a tiny model, and the routing analysis's arithmetic."""
import numpy as np
import pandas as pd
import pytest
from conftest import make_tiny_model

from reach_lens import stats
from reach_lens.stats import wilson_interval
from reach_lens.probes import deploy
from reach_lens.records import make_record
import reach_lens.routing.evaluate as evaluate
from reach_lens.routing import (MCTS, LearnedRouter, RandomSearch, RouteEvaluator, RouterCell, analysis, make_space,
                                random_route_candidates, router_rows, run_searches, search_rows)
from reach_lens.select import majority_vote
from reach_lens.tasks import get_task
from reach_lens.tasks.mc import make_mc_question


class CharTokenizer:
    """Printable ASCII and newline as ids 3..98 (0 pad, 1 BOS, 2 EOS)."""

    pad_token_id, bos_token_id, eos_token_id = 0, 1, 2
    padding_side = "right"

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        ids = [98 if c == "\n" else 3 + ord(c) - 32 for c in text]
        return {"input_ids": ([self.bos_token_id] if add_special_tokens else []) + ids}

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join("\n" if i == 98 else chr(i - 3 + 32) for i in ids if i >= 3)


# ---------------------------------------------------------------- graded candidates


@pytest.fixture(scope="module")
def char_model():
    m = make_tiny_model(n_layers=4, d_vocab=100, seed=1)
    m.tokenizer = CharTokenizer()
    return m


@pytest.fixture(scope="module")
def questions():
    return [make_mc_question("q1", "Which is hot?", ["ice", "fire", "snow"], 1),
            make_mc_question("q2", "What do bees make?", ["honey", "milk", "silk", "wool"], 0),
            make_mc_question("q3", "Sky colour?", ["green", "blue"], 1)]


def test_full_path_candidate_equals_deploy(char_model, questions):
    arc = get_task("arc_easy")
    ev = RouteEvaluator(char_model, arc, questions, "shared")
    deployed = deploy(char_model, arc, questions, "shared")
    for i, d in enumerate(deployed):
        c = ev.candidate(i, range(4))
        assert (c["text"], c["answer"], c["correct"], c["length"]) == (d["text"], d["answer"], d["correct"], d["length"])
        assert c["mean_logprob"] == pytest.approx(d["mean_logprob"], abs=1e-4)
        assert c["route"] == [0, 1, 2, 3] and len(c["hidden"]) == 32


def test_evaluator_memo_and_search_rewards(char_model, questions):
    arc = get_task("arc_easy")
    ev = RouteEvaluator(char_model, arc, questions, "shared", keep_hidden=False)
    generated = []
    inner = evaluate.route

    def counting(model, task, questions, fmt, routes, **kw):
        generated.extend((q.id, tuple(r)) for q, rs in zip(questions, routes) for r in rs)
        return inner(model, task, questions, fmt, routes, **kw)

    evaluate.route = counting
    space = make_space("skip_repeat", 4)
    searches = [RandomSearch(space, 6, 0), MCTS(space, 6, 1), RandomSearch(space, 6, 0)]
    question_of = [0, 1, 0]
    traces = run_searches(searches, ev.reward_fn(question_of))
    evaluate.route = inner
    pairs = {(question_of[s], r) for s, t in enumerate(traces) for r in t.routes}
    assert len(generated) == len(set(generated)) == len(pairs)  # the repeated search cost nothing
    for s, t in enumerate(traces):
        assert t.rewards == [float(ev.candidate(question_of[s], r)["correct"]) for r in t.routes]
    cands = [ev.candidate(0, r) for r in traces[0].routes]
    record = make_record(questions[0].id, questions[0].gold, cands[0], cands, majority_vote(cands))
    assert record["K"] == 6 and record["d"] == cands[0]["correct"] and cands[0]["hidden"] is None


def test_evaluator_splits_engine_calls_by_routes_and_gives_the_same_candidates(char_model, questions, monkeypatch):
    assert evaluate._calls({0: [1] * 3, 1: [1] * 2, 2: [1] * 4, 3: [1]}, 5) == [[0, 1], [2, 3]]
    assert evaluate._calls({0: [1] * 7, 1: [1]}, 5) == [[0], [1]]  # a question's routes are never split
    arc = get_task("arc_easy")
    space = make_space("skip_repeat", 4)
    pairs = [(i, r) for i in range(3) for r in [tuple(range(4)), *space.neighbors(tuple(range(4)))[:3]]]
    one_call = RouteEvaluator(char_model, arc, questions, "shared", keep_hidden=False).evaluate(pairs)
    calls = []
    inner = evaluate.route
    monkeypatch.setattr(evaluate, "ROUTES_PER_CALL", 5)
    monkeypatch.setattr(evaluate, "route", lambda m, t, qs, f, routes, **kw: calls.append(sum(map(len, routes)))
                        or inner(m, t, qs, f, routes, **kw))
    split = RouteEvaluator(char_model, arc, questions, "shared", keep_hidden=False).evaluate(pairs)
    assert calls == [4, 4, 4]
    assert [(c["route"], c["text"], c["correct"]) for c in split] == [(c["route"], c["text"], c["correct"])
                                                                      for c in one_call]


# ---------------------------------------------------------------- rows for the studies


def test_search_rows_and_random_route_candidates_share_routes(char_model, questions):
    arc = get_task("arc_easy")
    rows = search_rows(char_model, arc, questions[:2], "shared", ["skip_repeat"], ["random", "mcts"], K=5, seed=3)
    assert [r["question_id"] for r in rows] == ["q1", "q2"]
    for row in rows:
        traces = {t["method"]: t for t in row["searches"]}
        assert set(traces) == {"random", "mcts"} and all(len(t["routes"]) == 5 for t in traces.values())
        generated = {tuple(c["route"]) for c in row["candidates"]}
        assert generated == {tuple(r) for t in traces.values() for r in t["routes"]}  # each route generated once
        assert len(generated) == len(row["candidates"]) and all(c["hidden"] is None for c in row["candidates"]
                                                                if "hidden" in c)
        by_route = {tuple(c["route"]): c for c in row["candidates"]}
        assert all(w == float(by_route[tuple(r)]["correct"]) for t in traces.values()
                   for r, w in zip(t["routes"], t["rewards"]))
    cands = random_route_candidates(char_model, arc, questions[:2], "shared", "skip_repeat", 5, seed=3)
    for row, cs in zip(rows, cands):  # the selection study's route candidates are the routing study's random search
        random = next(t for t in row["searches"] if t["method"] == "random")
        assert [c["route"] for c in cs] == [list(r) for r in random["routes"]] and cs[0]["route"] == [0, 1, 2, 3]
        assert len(cs[0]["hidden"]) == 32
    # both route laws in one call: one random search each, beside the same structured search
    both = search_rows(char_model, arc, questions[:2], "shared", ["skip_repeat"], ["random", "mcts"], K=5, seed=3,
                       random_routes=("geometric", "uniform"))
    uniform = random_route_candidates(char_model, arc, questions[:2], "shared", "skip_repeat", 5, seed=3,
                                      random_routes="uniform")
    for row, old_row, cs in zip(both, rows, uniform):
        traces = {t["method"]: t for t in row["searches"]}
        assert set(traces) == {"random", "random_uniform", "mcts"}
        old_traces = {t["method"]: t for t in old_row["searches"]}
        assert traces["random"]["routes"] == old_traces["random"]["routes"]  # adding a law changes no other search
        assert traces["mcts"]["routes"] == old_traces["mcts"]["routes"]
        assert [c["route"] for c in cs] == [list(r) for r in traces["random_uniform"]["routes"]]
        assert traces["random_uniform"]["routes"] != traces["random"]["routes"]
    # MCTS in rounds of 2 routes: the random searches' routes and their greedy answers stay those of the
    # sequential run (float32 greedy decoding does not depend on the batch's other rows)
    paired = search_rows(char_model, arc, questions[:2], "shared", ["skip_repeat"], ["random", "mcts"], K=5, seed=3,
                         mcts_batch=2)
    for row, old_row in zip(paired, rows):
        traces, old_traces = ({t["method"]: t for t in r["searches"]} for r in (row, old_row))
        assert traces["random"]["routes"] == old_traces["random"]["routes"]
        assert max(traces["mcts"]["batch_sizes"]) == 2 and len(set(map(tuple, traces["mcts"]["routes"]))) == 5
        answers = {tuple(c["route"]): c["answer"] for c in row["candidates"]}
        old_answers = {tuple(c["route"]): c["answer"] for c in old_row["candidates"]}
        assert all(answers[tuple(r)] == old_answers[tuple(r)] for r in traces["random"]["routes"])


def test_router_rows_generate_only_unknown_routes(char_model, questions, monkeypatch):
    arc = get_task("arc_easy")
    routes = {"q1": (0, 1, 2, 3), "q2": (0, 2, 3), "q3": (1, 1, 2, 3)}
    known = {("q1", (0, 1, 2, 3)): {"answer": "Z", "correct": True}}  # a made-up known candidate is read, not regenerated
    asked = []
    inner = evaluate.route

    def counting(model, task, qs, fmt, rs, **kw):
        asked.extend((q.id, tuple(r[0])) for q, r in zip(qs, rs))
        return inner(model, task, qs, fmt, rs, **kw)

    monkeypatch.setattr(evaluate, "route", counting)
    rows = router_rows(char_model, arc, questions, "shared", routes, known)
    assert asked == [("q2", (0, 2, 3)), ("q3", (1, 1, 2, 3))]
    assert [(r["question_id"], r["route"], r["generated"]) for r in rows] == [
        ("q1", [0, 1, 2, 3], False), ("q2", [0, 2, 3], True), ("q3", [1, 1, 2, 3], True)]
    assert (rows[0]["answer"], rows[0]["correct"]) == ("Z", True)
    ev = RouteEvaluator(char_model, arc, questions, "shared", keep_hidden=False)
    assert [rows[i]["correct"] for i in (1, 2)] == [ev.candidate(1, (0, 2, 3))["correct"],
                                                    ev.candidate(2, (1, 1, 2, 3))["correct"]]


def test_learned_router_fits_once_and_only_when_asked(char_model, questions, monkeypatch):
    arc = get_task("arc_easy")
    fits = []
    inner = evaluate.cross_fit_router

    def counting(*a, **k):
        fits.append(1)
        return inner(*a, **k)

    monkeypatch.setattr(evaluate, "cross_fit_router", counting)
    found = {q.id: [((0, 1, 2, 3), 1.0), ((0, 2, 3), float(i % 2))] for i, q in enumerate(questions)}
    router = LearnedRouter(char_model, {
        "a": RouterCell(arc, questions[:2], {k: found[k] for k in ("q1", "q2")}, {}, "shared"),
        "b": RouterCell(arc, questions[2:], {"q3": found["q3"]}, {}, "shared")})
    assert fits == []
    rows = router.rows("a", questions[:1]) + router.rows("a", questions[1:2]) + router.rows("b", questions[2:])
    assert fits == [1] and [r["question_id"] for r in rows] == ["q1", "q2", "q3"]
    assert all(r["route"] == list(router.routes()[k][r["question_id"]]) for k, r in zip("aab", rows))


# ---------------------------------------------------------------- routing analysis arithmetic


def test_routing_analysis_oracle_vote_and_differences():
    import pandas as pd

    full, a, b, c = (0, 1, 2), (0, 2), (1, 2), (0, 1)
    # question q1: full wrong ("A"), a right ("B"), b wrong ("C"), c wrong ("A"); gold B
    answers = {("q1", full): ("A", False), ("q1", a): ("B", True), ("q1", b): (None, False), ("q1", c): ("A", False),
               ("q2", full): ("B", True), ("q2", a): (None, False), ("q2", b): ("B", True), ("q2", c): ("A", False)}

    def cands(q):
        return [{"route": list(r), "answer": ans, "correct": ok, "mean_logprob": -1.0, "length": 2}
                for (qq, r), (ans, ok) in answers.items() if qq == q]

    def search(method, routes, rewards):
        return {"space": "skip", "method": method, "seed": 0, "routes": [list(r) for r in routes], "rewards": rewards}

    searches = pd.DataFrame([
        {"question_id": "q2", "candidates": cands("q2"), "searches": [
            search("random", [full, a, c, b], [1.0, 0.0, 0.0, 1.0]), search("mcts", [full, c], [1.0, 0.0])]},
        {"question_id": "q1", "candidates": cands("q1"), "searches": [
            search("random", [full, c, a, b], [0.0, 0.0, 1.0, 0.0]), search("mcts", [full, b], [0.0, 0.0])]},
    ])
    router = pd.DataFrame({"question_id": ["q2", "q1"], "correct": [True, True]})
    pq = analysis.per_question(searches, K=4, n_layers=3, router=router)
    assert pq["qids"] == ["q1", "q2"] and list(pq["D"]) == [0.0, 1.0] and list(pq["router"]) == [1.0, 1.0]
    assert pq["oracle"][("skip", "random")].tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]
    assert pq["oracle"][("skip", "mcts")].tolist() == [[0, 0, 0, 0], [1, 1, 1, 1]]  # ended early: padded
    # q1 votes: A | A,A | A,A,B -> A | A,A,B,None -> A ; q2: B | B,None -> B | B,None,A -> tie B/A, first | B wins
    assert pq["vote"][("skip", "random")].tolist() == [[0, 0, 0, 0], [1, 1, 1, 1]]
    # format failures: the structured searches' 4 distinct candidates (q1's b), and the random routes' 8 (b, q2's a)
    assert pq["format_failures"]["skip"] == 1 / 4 and pq["random_format_failures"][("skip", "random")] == 2 / 8
    assert analysis.found_routes(searches, "skip")["q1"][:2] == [(full, 0.0), (c, 0.0)]

    tables = analysis.analyse({("embedded", "arc_easy"): pq}, ["skip"], ["random", "mcts"], K=4, vote_k=2, mcts_k=2)
    diff = tables["random_minus_structured"].iloc[0]
    assert diff["diff"] == 0.5 and not diff["collapsed"]
    counts = tables["direction_counts"].iloc[0]
    # two questions, random alone reaches one: 1 vs 0 discordant, exact McNemar p = 1, Newcombe interval around 0
    assert (diff.random_only, diff.structured_only, diff.both, diff.neither, diff.p) == (1, 0, 1, 0, 1.0)
    assert diff["diff_lo"] < 0 < diff["diff_hi"]
    assert analysis.direction_text(diff) == "not significant at 0.05 (p = 1.000)"
    assert (counts.random_better, counts.tie, counts.structured_better) == (0, 1, 0)
    t1 = tables["table1"].set_index("task")
    row = t1.loc["arc_easy"]
    assert row["learned_router_pp"] == 50.0 and row["random_oracle@4_pp"] == 50.0
    assert row["mcts_oracle@2_routes_pp"] == 0.0 and row["random_vote@2_pp"] == 0.0
    assert list(t1.index) == ["arc_easy", analysis.POOLED] and analysis.POOLED == "all questions pooled"
    curves = tables["oracle_curves"]
    random_curve = curves[curves.series == "random"]
    assert random_curve.value.tolist() == [0.5, 0.5, 1.0, 1.0] and (random_curve.lo <= random_curve.value).all()
    # proportions carry Wilson intervals (1 of 2 questions: [0.095, 0.905]; 2 of 2: [0.342, 1]), differences Newcombe's
    assert random_curve.lo.round(3).tolist() == [0.095, 0.095, 0.342, 0.342] and random_curve.hi.tolist()[2:] == [1, 1]
    assert (diff.random_oracle_lo, diff.random_oracle_hi) == wilson_interval(2, 2)
    assert (diff.structured_oracle_lo, diff.structured_oracle_hi) == wilson_interval(1, 2)
    assert (diff.D, diff.D_lo, diff.D_hi) == (0.5, *wilson_interval(1, 2)) and (curves.D_lo == diff.D_lo).all()

    # a collapsed cell (format failures above the threshold) is counted apart and left out of the clean counts
    collapsed = analysis.analyse({("embedded", "arc_easy"): pq}, ["skip"], ["random", "mcts"], K=4,
                                 collapse_threshold=0.1)
    assert collapsed["random_minus_structured"].collapsed.all()
    # random routes that break the format (as a uniform law's can) do not make the cell collapsed: they are its result
    pq["random_format_failures"][("skip", "random")] = 0.95
    broken = analysis.analyse({("embedded", "arc_easy"): pq}, ["skip"], ["random", "mcts"], K=4, collapse_threshold=0.3)
    row = broken["random_minus_structured"].iloc[0]
    assert not row.collapsed and row.random_format_failure_rate == 0.95 and row.format_failure_rate == 0.25
    c = collapsed["direction_counts"].iloc[0]
    assert (c.clean_cells, c.collapsed_cells, c.random_better) == (0, 1, 0)


def test_a_direction_needs_the_exact_paired_test_below_005():
    # (random_only, structured_only): 13 vs 3 (p = 0.021), 12 vs 4 (p = 0.077), 0 vs 6 (p = 0.031), 0 vs 0, 5 vs 0
    # (p = 0.0625); the 12 vs 4 cell's Newcombe interval [+0.04, +15.9] pp excludes 0, its test does not reject
    rows = [(13, 3), (12, 4), (0, 6), (0, 0), (5, 0)]
    diffs = pd.DataFrame([{"space": "skip", "method": "mcts", "diff": (a - b) / 100, "diff_lo": -1, "diff_hi": 1,
                           "p": stats.mcnemar_p(a, b), "random_only": a, "structured_only": b, "collapsed": False}
                          for a, b in rows])
    assert [analysis.direction(r) for _, r in diffs.iterrows()] == [
        "random_better", "tie", "structured_better", "tie", "tie"]
    assert [analysis.direction_text(r) for _, r in diffs.iterrows()][:3] == [
        "random higher, significant at 0.05 (p = 0.021)", "not significant at 0.05 (p = 0.077)",
        "mcts higher, significant at 0.05 (p = 0.031)"]
    c = analysis.direction_counts(diffs).iloc[0]
    assert (c.random_better, c.tie, c.structured_better, c.clean_cells) == (1, 3, 1, 5)


def test_table1_pools_every_question_of_a_model():
    def cell(D, rand):
        n = len(D)
        return {"D": np.array(D, float), "router": np.array(D, float), "vote": {("skip", "random"): np.zeros((n, 4))},
                "oracle": {("skip", "random"): np.tile(np.array(rand, float)[:, None], (1, 4))}}

    cells = {("m", "a"): cell([0, 0], [1, 1]), ("m", "b"): cell([1, 1, 0, 0], [1, 1, 0, 0])}
    t1 = analysis.gains_over_unmodified(cells, "skip", ["random"], K=4, vote_k=2, mcts_k=2).set_index("task")
    assert t1["random_oracle@4_pp"].to_dict() == pytest.approx({"a": 100.0, "b": 0.0, analysis.POOLED: 100 * 2 / 6})
    assert t1.loc[analysis.POOLED, "n"] == 6  # pooled over questions, not the mean of the task columns


def test_routing_analysis_of_several_spaces_laws_and_structured_methods():
    """Every (space, structured method) pair of every cell is compared with the chosen random law's search."""
    import pandas as pd

    full, a, b = (0, 1, 2), (0, 2), (1, 2)
    correct = {full: False, a: True, b: False}

    def search(space, method, routes):
        return {"space": space, "method": method, "seed": 0, "routes": [list(r) for r in routes],
                "rewards": [float(correct[r]) for r in routes]}

    traces = [search(space, method, routes) for space in ("skip", "segments")
              for method, routes in (("random", [full, a]), ("random_uniform", [full, b]), ("mcts", [full, b]),
                                     ("genetic", [full, a]))]
    cands = [{"route": list(r), "answer": "A" if ok else "B", "correct": ok, "mean_logprob": -1.0, "length": 1}
             for r, ok in correct.items()]
    pq = analysis.per_question(pd.DataFrame([{"question_id": "q", "candidates": cands, "searches": traces}]), K=2,
                               n_layers=3, router=pd.DataFrame({"question_id": ["q"], "correct": [False]}))
    methods = ["random", "mcts", "genetic"]
    for law, expected in (("random", {"mcts": 1.0, "genetic": 0.0}), ("random_uniform", {"mcts": 0.0, "genetic": -1.0})):
        diffs = analysis.analyse({("m", "t"): pq}, ["skip", "segments"], methods, K=2, vote_k=2, mcts_k=2,
                                 random_method=law)["random_minus_structured"]
        assert len(diffs) == 2 * 2 and set(diffs.space) == {"skip", "segments"}
        for row in diffs.itertuples():
            assert row.diff == expected[row.method], (law, row.space, row.method)
    with pytest.raises(ValueError, match="not a random search"):
        analysis.analyse({("m", "t"): pq}, ["skip"], methods, K=2, random_method="mcts")
