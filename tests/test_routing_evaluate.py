"""Graded route candidates (RouteEvaluator) on a tiny model, and the routing experiment's arithmetic."""
import numpy as np
import pytest
from conftest import make_tiny_model

from reach_lens.probes import deploy
from reach_lens.records import make_record
from reach_lens.routing import MCTS, RandomSearch, RouteEvaluator, make_space, run_searches
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
    import reach_lens.routing.evaluate as evaluate
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


# ---------------------------------------------------------------- experiments/routing.py arithmetic


def load_routing_experiment():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "experiments" / "routing.py"
    spec = importlib.util.spec_from_file_location("routing_experiment", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_routing_experiment_oracle_vote_and_differences():
    import pandas as pd

    exp = load_routing_experiment()
    full, a, b, c = (0, 1, 2), (0, 2), (1, 2), (0, 1)
    # question q1: full wrong ("A"), a right ("B"), b wrong ("C"), c wrong ("A"); gold B
    answers = {("q1", full): ("A", False), ("q1", a): ("B", True), ("q1", b): ("C", False), ("q1", c): ("A", False),
               ("q2", full): ("B", True), ("q2", a): (None, False), ("q2", b): ("B", True), ("q2", c): ("A", False)}
    cands = pd.DataFrame([{"question_id": q, "route": list(r), "answer": ans, "correct": ok, "mean_logprob": -1.0,
                           "length": 2} for (q, r), (ans, ok) in answers.items()])
    cands["answer"] = pd.Series([ans for ans, _ in answers.values()], dtype=object)  # None stays None, as in RunStore
    traces = pd.DataFrame([
        {"question_id": "q1", "space": "skip", "method": "random", "rewards": [0.0, 0.0, 1.0, 0.0], "routes": [full, c, a, b]},
        {"question_id": "q1", "space": "skip", "method": "mcts", "rewards": [0.0, 0.0], "routes": [full, b]},
        {"question_id": "q2", "space": "skip", "method": "random", "rewards": [1.0, 0.0, 0.0, 1.0], "routes": [full, a, c, b]},
        {"question_id": "q2", "space": "skip", "method": "mcts", "rewards": [1.0, 0.0], "routes": [full, c]},
    ])
    pq = exp.per_question(traces, cands, K=4, n_layers=3)
    assert pq["qids"] == ["q1", "q2"] and list(pq["D"]) == [0.0, 1.0]
    assert pq["oracle"][("skip", "random")].tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]
    assert pq["oracle"][("skip", "mcts")].tolist() == [[0, 0, 0, 0], [1, 1, 1, 1]]  # ended early: padded
    # q1 votes: A | A,A | A,A,B -> A | A,A,B,C -> A ; q2: B | B,None -> B | B,None,A -> tie B/A, first | B wins
    assert pq["vote"]["skip"].tolist() == [[0, 0, 0, 0], [1, 1, 1, 1]]
    assert pq["format_failures"]["skip"] == 1 / 8
    args = exp.parse_args(["--spaces", "skip", "--methods", "random", "mcts", "--K", "4", "--vote-k", "2",
                           "--mcts-k", "2"])
    pq["router"] = np.array([1.0, 1.0])  # the learned router's route answered both correctly
    tables = exp.analyse({("embedded", "arc_easy"): pq}, args)
    diff = tables["random_minus_structured"].iloc[0]
    assert diff["diff"] == 0.5 and not diff["collapsed"]
    counts = tables["direction_counts"].iloc[0]
    assert (counts.random_better, counts.tie, counts.structured_better) == (1, 0, 0)
    t1 = tables["table1"].set_index("task").loc["arc_easy"]
    assert t1["learned_router_pp"] == 50.0 and t1["random_oracle@4_pp"] == 50.0 and t1["mcts_oracle@2_pp"] == 0.0 and t1["random_vote@2_pp"] == 0.0
