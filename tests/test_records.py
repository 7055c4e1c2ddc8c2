"""Records as data: the one candidate builder (from a Generation) and make_record with the caller's vote."""
import math

import pytest
import torch

from reach_lens.generate.types import Generation
from reach_lens.records import CANDIDATE_KEYS, RECORD_COLUMNS, candidate, make_record
from reach_lens.select import majority_vote
from reach_lens.tasks import Graded, Question

Q = Question("q7", "2+3?", "5")


class StandInTask:
    """Grades by the last word of the completion; records every call."""

    def __init__(self):
        self.calls = []

    def grade(self, q: Question, completion: str) -> Graded:
        self.calls.append((q.id, completion))
        words = completion.split()
        answer = words[-1] if words else None
        return Graded(answer, answer == q.gold)


def gen(text="so 5", tokens=(11, 12, 13), logprobs=(-0.1, -0.2, -0.6), entropies=(1.0, 0.5, 0.0), **kw):
    return Generation(tokens=list(tokens), token_logprobs=list(logprobs), token_entropies=list(entropies),
                      finish_reason=kw.pop("finish_reason", "eos"), text=text, **kw)


def cand(answer, correct=False, lp=-1.0, length=10, **extra):
    return {"text": f"so {answer}", "answer": answer, "correct": correct, "mean_logprob": lp, "length": length, **extra}


def deployed(answer, correct):
    return {"text": f"the answer is {answer}", "answer": answer, "correct": correct}


# ---- candidate


def test_candidate_from_a_generation():
    task = StandInTask()
    c = candidate(task, Q, gen(route=(0, 1, 1, 3)), temperature=0.8)
    assert task.calls == [("q7", "so 5")]
    assert c == {"text": "so 5", "answer": "5", "correct": True, "mean_logprob": pytest.approx(-0.3), "length": 3,
                 "f1": None, "entropy": pytest.approx(0.5), "finish_reason": "eos", "route": [0, 1, 1, 3], "hidden": None,
                 "temperature": 0.8}
    assert type(c["correct"]) is bool and set(CANDIDATE_KEYS) <= set(c)


def test_candidate_carries_the_graders_partial_credit():
    class F1Task:
        def grade(self, q, completion):
            return Graded("23 years old", False, f1=0.8)

    c = candidate(F1Task(), Q, gen())
    assert c["f1"] == pytest.approx(0.8) and c["correct"] is False


def test_candidate_without_text_or_route_and_wrong_answer():
    task = StandInTask()
    c = candidate(task, Q, gen(text=None, finish_reason="length"))
    assert task.calls == [("q7", "")] and c["text"] == "" and c["answer"] is None and c["correct"] is False
    assert c["route"] is None and c["finish_reason"] == "length"
    assert candidate(task, Q, gen(text="it is 4"))["correct"] is False


def test_candidate_hidden_only_when_asked_and_present():
    h = torch.tensor([0.25, -1.5, 3.0], dtype=torch.bfloat16)
    g = gen(hidden=h)
    assert candidate(StandInTask(), Q, g)["hidden"] is None
    kept = candidate(StandInTask(), Q, g, keep_hidden=True)["hidden"]
    assert kept == [0.25, -1.5, 3.0] and all(type(x) is float for x in kept)
    assert candidate(StandInTask(), Q, gen(), keep_hidden=True)["hidden"] is None
    with pytest.raises(ValueError, match=r"one \[d_model\] vector, got shape \(1, 3\)"):
        candidate(StandInTask(), Q, gen(hidden=h[None]), keep_hidden=True)


def test_candidate_refuses_clashing_extras_and_empty_generations():
    with pytest.raises(ValueError, match=r"extra keys \['answer', 'hidden'\] would overwrite"):
        candidate(StandInTask(), Q, gen(), answer="6", hidden=[1.0])
    with pytest.raises(ValueError, match="question 'q7': the generation has no tokens"):
        candidate(StandInTask(), Q, gen(tokens=(), logprobs=(), entropies=()))


def test_candidates_make_a_record_that_round_trips_the_vote():
    task = StandInTask()
    cands = [candidate(task, Q, gen(text=t)) for t in ("so 4", "so 5", "so 5", "no idea:")]
    r = make_record(Q.id, Q.gold, deployed("4", False), cands, majority_vote(cands))
    assert (r["K"], r["hits"], r["o"], r["format_failures"], r["vote_answer"], r["vote_correct"]) == \
        (4, 2, True, 0, "5", True)
    assert list(r) == list(RECORD_COLUMNS)


# ---- make_record (moved from audit)


def test_make_record_derives_fields():
    cands = [cand("5", True, lp=-0.2), cand(None), cand("4"), cand("4"), cand("5", True), cand(None), cand("4"),
             cand("5", True, entropy=0.3)]
    r = make_record(17, "5", deployed("4", False), cands, majority_vote(cands))
    assert r["question_id"] == "17"
    assert (r["d"], r["K"], r["hits"], r["o"], r["format_failures"]) == (False, 8, 3, True, 2)
    # "4" and "5" tie with 3 votes; "5" has summed seq log-prob -2 - 10 - 10 > -30 of "4"
    assert r["vote_answer"] == "5" and r["vote_correct"] is True
    assert r["candidates"][7]["entropy"] == 0.3  # optional channels carried through


def test_make_record_takes_the_vote_it_is_given():
    cands = [cand("5", True), cand("5", True), cand("4")]
    assert majority_vote(cands) == 0
    r = make_record("q", "5", deployed("4", False), cands, 2)  # another selector's pick
    assert r["vote_answer"] == "4" and r["vote_correct"] is False and r["hits"] == 2


def test_make_record_vote_none_when_every_candidate_fails():
    cands = [cand(None), cand(None)]
    r = make_record("q", "5", deployed(None, False), cands, majority_vote(cands))
    assert r["vote_answer"] is None and r["vote_correct"] is False and r["format_failures"] == 2 and not r["o"]


@pytest.mark.parametrize("vote", [-1, 3, True, 1.0, "0", None])
def test_make_record_refuses_a_vote_that_is_not_a_candidate_index(vote):
    with pytest.raises(ValueError, match=rf"vote {vote!r} must be the index of a candidate \(an int in 0..2\)"):
        make_record("q", "5", deployed("5", True), [cand("5", True), cand("4"), cand("3")], vote)


def test_make_record_rejects_inconsistent_input():
    with pytest.raises(ValueError, match="cannot be graded correct"):
        make_record("q", "5", deployed("5", True), [cand(None, True)], 0)
    with pytest.raises(ValueError, match="deployed: answer None"):
        make_record("q", "5", deployed(None, True), [cand("5", True)], 0)
    with pytest.raises(ValueError, match=r"candidate 0 lacks keys \['length'\]"):
        make_record("q", "5", deployed("5", True), [{"text": "", "answer": "5", "correct": True, "mean_logprob": 0}], 0)
    with pytest.raises(ValueError, match=r"deployed lacks keys \['correct'\]"):
        make_record("q", "5", {"text": "", "answer": "5"}, [cand("5")], 0)
    with pytest.raises(ValueError, match="at least one candidate"):
        make_record("q", "5", deployed("5", True), [], 0)
    with pytest.raises(TypeError, match="must be str or None"):
        make_record("q", "5", deployed("5", True), [cand(5)], 0)
    with pytest.raises(ValueError, match="mean_logprob must be finite"):
        make_record("q", "5", deployed("5", True), [cand("5", lp=math.nan)], 0)


def test_record_table_and_candidate_frame_of_a_probe_run():
    from reach_lens.records import RECORD_COLUMNS, candidate_frame, record_table

    qs = [Q, Question("q8", "1+1?", "2")]
    greedy = [deployed("5", True), deployed("3", False)]
    cands = [[cand("5", True), cand("4"), cand("5", True)], [cand("2", True), cand("3"), cand("3")]]
    records = record_table(qs, greedy, cands, majority_vote)
    assert list(records.columns) == list(RECORD_COLUMNS) and list(records.question_id) == ["q7", "q8"]
    assert list(records.hits) == [2, 1] and list(records.vote_answer) == ["5", "3"] and list(records.d) == [True, False]
    first = record_table(qs, greedy, cands, vote=lambda cs: 0)
    assert list(first.vote_answer) == ["5", "2"]
    frame = candidate_frame(qs, cands)
    assert list(frame.question_id) == ["q7"] * 3 + ["q8"] * 3 and list(frame.k) == [0, 1, 2] * 2
    assert list(candidate_frame(qs, greedy).k) == [0, 0]  # deploy's one answer per question
    with pytest.raises(ValueError, match="2 questions, 1 deployed answers and 2 candidate lists"):
        record_table(qs, greedy[:1], cands, majority_vote)
