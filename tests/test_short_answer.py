"""Free-form short-answer tasks (SQuAD, TriviaQA, NQ-Open, Jeopardy) and GSM8K's OLMES requests, on real rows of
the embedded data package: parsing, the three prompt formats, the fixed few-shot blocks, and the grader."""
import json
import re
import string

import pytest

from reach_lens.tasks import get_task, sources
from reach_lens.tasks.base import Question
from reach_lens.tasks.short_answer import first_line, grade_short_answer, normalize_answer, token_f1
from reach_lens.generate import engine_for

CHAT = "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}<|end|>\n{% endfor %}<|assistant|>\n"


class ChatTokenizer:
    chat_template = CHAT

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        return "".join(f"<|{m['role']}|>\n{m['content']}<|end|>\n" for m in messages) + "<|assistant|>\n"


@pytest.fixture(scope="module")
def squad():
    task = get_task("squad")
    return task, {q.id: q for q in task.load()}


def test_normalization_is_squads():
    assert normalize_answer("The Eiffel  Tower!") == "eiffel tower"
    assert normalize_answer("an apple, a pear and THE plum.") == "apple pear and plum"
    assert normalize_answer("U.S.") == "us" and normalize_answer("  ") == ""
    assert normalize_answer("Theatre") == "theatre"  # articles are whole words only
    assert token_f1("23 years old", "23 years") == pytest.approx(0.8) and token_f1("", "x") == 0.0


def test_only_the_first_line_counts():
    assert first_line("  Denver Broncos\n\nTitle: Super_Bowl_50\nBackground: ...") == "Denver Broncos"
    assert first_line("\n\n Answer: Paris\nGermany") == "Paris"
    assert first_line("") == ""
    # a chat model's answer label is not part of the answer; words that merely start like one are
    assert first_line("The answer to the question is Newcastle.") == "Newcastle."
    assert first_line("The answer is: 1130\nbecause ...") == "1130"
    assert first_line("The Answer") == "The Answer" and first_line("Answering machines") == "Answering machines"


def test_squad_rows_aliases_numbers_and_longer_generations(squad):
    task, by_id = squad
    assert len(by_id) == 1000
    q = by_id["5727dd2e4b864d1900163eba"]  # "predates 'The Game' by how many years?": gold spans 23 years, 23, 23
    assert q.aliases == ("23 years", "23") and q.gold == "23 years"
    assert q.context.startswith("Title: Harvard_University\nBackground: Older than The Game by 23 years")
    cases = [(" 23 years", "23 years", True, 1.0), (" 23", "23", True, 1.0), ("23 Years.", "23 years", True, 1.0),
             (" 23 years old", "23 years old", False, 0.8),  # numbers: "23" and "23 years" are aliases, this is not
             (" 24", "24", False, 0.0),
             (" twenty-three\n23 years", "twentythree", False, 0.0),  # only the first line counts
             (" 23 years\n\nTitle: Harvard_University", "23 years", True, 1.0),
             ("", None, False, 0.0), (" \n\n", None, False, 0.0), (" ...", None, False, 0.0),
             (" The", None, False, 0.0)]  # unparseable: nothing survives normalization
    for completion, answer, correct, f1 in cases:
        graded = task.grade(q, completion)
        assert (graded.answer, graded.correct) == (answer, correct), completion
        assert graded.f1 == pytest.approx(f1), completion


def test_squad_articles_and_punctuation_on_a_real_row(squad):
    task, by_id = squad
    q = next(q for q in by_id.values() if any(a.lower().startswith("the ") for a in q.aliases))
    alias = next(a for a in q.aliases if a.lower().startswith("the "))
    assert task.grade(q, " " + alias[4:] + ".").correct  # without its article, with a period
    assert task.grade(q, " " + alias.upper()).correct


def test_squad_formats_and_the_fixed_olmes_shots(squad):
    task, by_id = squad
    requests = sources.embedded_requests("squad")
    for request in requests[:50]:
        q = by_id[request["doc"]["id"]]
        assert task.prompt(q, "fewshot", None) == request["request"]["context"]  # exactly OLMES's prompt
    q = by_id[requests[0]["doc"]["id"]]
    name, shots = task.shots()
    assert name == "OLMES:squad" and shots.startswith("The following are reading comprehension questions")
    assert shots.count("\nAnswer:") == 5 and shots.endswith("\n\n")
    assert task.prompt(q, "shared", None) == shots[: shots.index("Title:")] + task.query(q)  # zero-shot
    native = task.prompt(q, "native", ChatTokenizer())
    assert native.startswith("<|user|>\nTitle: Harvard_University\nBackground:") and "shortest segment" in native
    assert task.stop_strings("fewshot") == ("Title:", "\n\n") and task.max_new_tokens("fewshot") == 32
    for request in requests[:5]:  # OLMES's stop sequences, not a bare line break (a zero-shot answer may start so)
        assert set(task.stop_strings("shared")) == set(request["request"]["stop_sequences"])
    spec = task.prompt_spec("fewshot")
    assert spec.startswith("squad:fewshot/1:OLMES:squad:sha256=") and task.prompt_spec("shared") == "squad:shared/1"
    with pytest.raises(ValueError, match="unknown prompt format 'cot'"):
        task.prompt(q, "cot", None)
    with pytest.raises(ValueError, match="not multiple-choice"):
        task.recognition_items(q)


def test_squad_hugging_face_layout(tmp_path):
    row = {"id": "s1", "title": "Paris", "context": "Paris is the capital of France.", "question": "What is Paris?",
           "answers": {"text": ["the capital of France", "capital of France", "the capital of France"],
                       "answer_start": [12, 16, 12]}}
    (tmp_path / "validation.jsonl").write_text(json.dumps(row) + "\n" + json.dumps({**row, "id": "s2",
                                                                                     "answers": {"text": []}}) + "\n")
    task = get_task("squad")
    with pytest.raises(ValueError, match=r"validation\.jsonl line 2: no gold answer"):
        task.load(tmp_path)
    with pytest.warns(UserWarning, match="skipped 1"):
        (q,) = task.load(tmp_path, skip_malformed=True)
    assert q == Question("s1", "What is Paris?", "the capital of France", aliases=("the capital of France",
                         "capital of France"), context="Title: Paris\nBackground: Paris is the capital of France.")
    assert task.grade(q, " Capital of France").correct


def test_trivia_qa_aliases_and_held_out_shots():
    task = get_task("trivia_qa")
    questions = task.load()
    assert len(questions) == 7993 - 5
    q = next(q for q in questions if q.id == "tc_33")  # Sunset Boulevard, with its aliases
    assert q.gold == "Sunset Boulevard" and "Sunset Blvd" in q.aliases
    assert task.grade(q, " Sunset Blvd.").correct and task.grade(q, " sunset boulevard\nthe musical").correct
    assert not task.grade(q, " Cats").correct
    name, shots = task.shots()
    shot_ids = name.split()[-1].split(",")
    assert len(shot_ids) == 5 and not set(shot_ids) & {q.id for q in questions}
    assert shots.count("Question:") == 5 and task.prompt(q, "fewshot", None) == shots + (
        "Question: Which Lloyd Webber musical premiered in the US on 10th December 1993?\nAnswer:")
    assert task.prompt(q, "shared", None) == task.query(q)


def test_nq_open_and_jeopardy_follow_olmes():
    for name, key, count in (("nq_open", "naturalqs_open", 1000), ("jeopardy", "jeopardy", 2116)):
        task = get_task(name)
        questions = task.load(split=None)
        assert len(questions) == count
        requests = sources.embedded_requests(key)
        assert all(task.prompt(q, "fewshot", None) == r["request"]["context"] for q, r in zip(questions, requests))
        assert set(task.stop_strings("fewshot")) == set(requests[0]["request"]["stop_sequences"])
    nq = get_task("nq_open").load()[0]
    assert nq.id == "nq_open-3187" and nq.aliases == ("Justin Timberlake",)
    assert get_task("nq_open").grade(nq, " justin timberlake.").correct
    jeopardy = get_task("jeopardy")
    clue = jeopardy.load()[0]
    assert clue.context == "SCIENCE" and clue.gold == "sound"
    assert jeopardy.grade(clue, " Sound").correct and not jeopardy.grade(clue, " What is sound?").correct


def test_gsm8k_defaults_to_olmes_requests_with_a_fewshot_format():
    task = get_task("gsm8k")
    questions = task.load()
    assert len(questions) == 1319 and questions[0].id == "gsm8k-test-1" and questions[0].gold == "18"
    requests = sources.embedded_requests("gsm8k")
    assert task.prompt(questions[0], "fewshot", None) == requests[0]["request"]["context"]
    assert task.prompt(questions[0], "fewshot", None).count("So the answer is") == 8
    assert task.stop_strings("fewshot") == ("Question:", "\n\n") and task.grade(questions[0], " ... So the answer is 18.").correct
    assert task.prompt_spec("fewshot").startswith("gsm8k:fewshot/1:STD:GSM8k") and task.prompt_spec("shared") is None


def test_auto_format_is_the_tasks_default_and_shared_for_a_base_model():
    class Base:
        chat_template = None

    assert get_task("squad").resolve_format("auto", ChatTokenizer()) == "fewshot"
    assert get_task("arc_easy").resolve_format("auto", ChatTokenizer()) == "native"
    assert get_task("arc_easy").resolve_format("auto", Base()) == "shared"
    assert get_task("arc_easy").resolve_format("shared", ChatTokenizer()) == "shared"
    with pytest.raises(ValueError, match="unknown prompt format 'fewshot' for task 'arc_easy'"):
        get_task("arc_easy").resolve_format("fewshot", None)


def test_grading_needs_aliases():
    with pytest.raises(ValueError, match="no gold aliases"):
        grade_short_answer("x", ())


# Reference graders, re-implemented from their sources, to pin where short_answer_em/1 differs (docs/tasks.md).
# lm-evaluation-harness 0.4.13, lm_eval/tasks/triviaqa/default.yaml and nq_open/nq_open.yaml: generation `until`
# "\n", "." and ","; the `remove_whitespace` filter (str.strip); `exact_match` with ignore_case and
# ignore_punctuation (lm_eval/api/metrics.py: regexes_to_ignore deleted first, then lower-case, then
# string.punctuation deleted; no whitespace collapsing); a list of targets is correct when any one matches.
LM_EVAL_UNTIL = ("\n", ".", ",")
NQ_OPEN_REGEXES = (r"\b(?:The |the |An |A |The |a |an )",)


def lm_eval_exact_match(completion, golds, regexes_to_ignore=()):
    for term in LM_EVAL_UNTIL:  # lm_eval.models.utils.postprocess_generated_text
        completion = completion.split(term)[0]
    prediction = completion.strip()

    def normalize(text):
        for regex in regexes_to_ignore:
            text = re.sub(regex, "", text)
        return text.lower().translate(str.maketrans("", "", string.punctuation))

    return any(normalize(prediction) == normalize(gold) for gold in golds)


def lm_eval_triviaqa(completion, golds):
    return lm_eval_exact_match(completion, golds)


def lm_eval_nq_open(completion, golds):
    return lm_eval_exact_match(completion, golds, NQ_OPEN_REGEXES)


def squad_v11(prediction, golds):
    """evaluate-v1.1.py: exact_match_score, max over ground truths, of the whole prediction."""

    def normalize_answer(s):
        s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
        return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())

    return max(normalize_answer(prediction) == normalize_answer(gold) for gold in golds)


def verdicts(completion, golds):
    """(ours, lm-eval triviaqa, lm-eval nq_open, SQuAD v1.1): correct or not."""
    return (grade_short_answer(completion, golds).correct, lm_eval_triviaqa(completion, golds),
            lm_eval_nq_open(completion, golds), squad_v11(completion, golds))


def test_reference_graders_agree_with_ours_on_a_plain_answer():
    assert verdicts(" Naples", ("Naples",)) == (True, True, True, True)
    assert verdicts(" naples.", ("Rome", "Naples")) == (True, True, True, True)  # any gold alias counts
    assert verdicts(" Sunset Blvd.", ("Sunset Boulevard", "Sunset Blvd.")) == (True, True, True, True)
    assert verdicts(" Rome", ("Naples",)) == (False, False, False, False)


def test_an_answer_label_is_dropped_here_only():
    """The 7 of 800 zero-shot generations graded differently from lm-evaluation-harness were all of this kind."""
    assert verdicts(" The answer is: Naples", ("Naples",)) == (True, False, False, False)
    assert verdicts(" Answer: Naples", ("Naples",)) == (True, False, False, False)
    assert verdicts(" The answer to the question is Naples", ("Naples",)) == (True, False, False, False)


def test_lm_eval_cuts_the_answer_at_the_first_comma_or_period():
    assert verdicts(" Naples, Italy", ("Naples",)) == (False, True, True, False)  # lenient there
    assert verdicts(" St. Louis", ("St. Louis",)) == (True, False, False, True)  # "St" there
    assert verdicts(" 1,000", ("1000",)) == (True, False, False, True)  # "1" there


def test_lm_eval_cuts_at_a_leading_line_break_the_first_line_here_skips_it():
    assert verdicts("\nNaples", ("Naples",)) == (True, False, False, True)


def test_the_squad_script_grades_the_whole_prediction_here_only_its_first_line():
    assert verdicts(" Naples\nNaples is in Italy", ("Naples",)) == (True, True, True, False)
    assert verdicts(" naples.\n\nQuestion: ...", ("Rome", "Naples")) == (True, True, True, False)


def test_lm_eval_triviaqa_keeps_articles():
    assert verdicts(" The Beatles", ("Beatles",)) == (True, False, True, True)
    assert verdicts(" Beatles", ("The Beatles",)) == (True, False, True, True)


def test_lm_eval_nq_open_removes_only_articles_capitalized_as_in_its_regex():
    assert verdicts(" THE BEATLES", ("The Beatles",)) == (True, True, False, True)
    assert normalize_answer("THE BEATLES") == normalize_answer("The Beatles") == "beatles"


def test_lm_eval_does_not_collapse_whitespace():
    assert verdicts(" Sunset  Boulevard", ("Sunset Boulevard",)) == (True, False, False, True)


@pytest.mark.integration
def test_squad_on_the_embedded_model_shares_the_shots_and_equals_prompts_run_alone(embedded_model):
    """OLMES's 5-shot SQuAD prompts (~1,250 tokens) on the embedded model: the engine computes the shots once and
    each question's tokens after them, and greedy answers and their log-probs equal those of prompts prefilled
    alone (samples: on tiny models, tests/test_engine.py); the protocol records the shots' hash."""
    import torch

    from reach_lens import Protocol, deploy, subsample
    from reach_lens.generate import TransformerLensEngine

    model = embedded_model
    task = get_task("squad")
    questions = subsample(task.load(), 2, seed=0)
    shared, alone = TransformerLensEngine(model), TransformerLensEngine(model, share_prefixes=False)
    greedy = deploy(shared, task, questions, "fewshot")
    reference = deploy(alone, task, questions, "fewshot")
    assert [g["text"] for g in greedy] == [r["text"] for r in reference]
    assert [g["mean_logprob"] for g in greedy] == pytest.approx([r["mean_logprob"] for r in reference], abs=1e-4)
    shots = shared.prefix_cache.longest_prefix(tuple(shared.encode(task.prompt(questions[0], "fewshot", None))))
    assert shots is not None and len(shots) > 900  # the five shots (~1,000 tokens), computed once for both questions
    assert all(0.0 <= g["f1"] <= 1.0 for g in greedy)  # token F1 recorded beside exact match
    protocol = Protocol.of(study="test", facts=engine_for(model).describe(), task=task, questions=questions, fmt="fewshot",
                           probe="deploy")
    assert protocol.prompt == task.prompt_spec("fewshot") and torch.get_num_threads() >= 1
