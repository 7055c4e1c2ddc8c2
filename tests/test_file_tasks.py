"""Tasks from a user's file (jsonl:, json:, csv:, parquet:) and the task registry: field defaults and mappings, every
grader, shots, the protocol's task_spec, and bad rows refused naming file, row and field before anything runs."""
import csv
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import needs_shared_data, SHARED_DATA

from reach_lens.protocol import Protocol
from reach_lens.tasks import Task, get_task, register_task, task_names

FACTS = {"model": "tiny", "weights": "0" * 16, "device": "cpu", "dtype": "float32"}


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


QA = [{"id": "q1", "question": "Capital of France?", "answers": ["Paris", "paris, france"]},
      {"id": "q2", "question": "Two plus two?", "answers": "four"}]


def test_free_form_file_reads_common_fields_and_grades_by_exact_match(tmp_path):
    path = write_jsonl(tmp_path / "my_qa.jsonl", [QA[0], {**QA[1], "answers": ["four", "4"]}])
    task = get_task(f"jsonl:{path}")
    assert task.name == "my_qa" and task.kind == "short_answer" and task.grader == "short_answer_em/1"
    questions = task.load()
    assert [q.id for q in questions] == ["q1", "q2"] and questions[0].aliases == ("Paris", "paris, france")
    assert task.grade(questions[0], " Paris\nmore").correct and task.grade(questions[1], "4").correct
    assert not task.grade(questions[1], "five").correct
    assert task.prompt(questions[0], "shared", None) == "Question: Capital of France?\nAnswer:"
    assert task.fields == {"question": "question", "id": "id", "answer": "answers"}


def test_explicit_mapping_dotted_paths_context_and_hashed_ids(tmp_path):
    records = [{"q": {"text": "Who wrote it?"}, "passage": "Ann wrote the book.", "gold": {"value": "Ann"}},
               {"q": {"text": "What did she write?"}, "passage": "Ann wrote the book.", "gold": {"value": "the book"}}]
    path = write_jsonl(tmp_path / "reading.jsonl", records)
    task = get_task(f"jsonl:{path}", fields={"question": "q.text", "answers": "gold.value"})
    first, second = task.load()
    assert first.context == "Ann wrote the book." and first.gold == "Ann"
    assert first.id.startswith("reading-") and len(first.id) == len("reading-") + 12 and first.id != second.id
    assert [q.id for q in task.load()] == [first.id, second.id]  # stable across loads
    assert task.prompt(first, "shared", None) == "Ann wrote the book.\nQuestion: Who wrote it?\nAnswer:"
    assert task.spec()["fields"] == {"question": "q.text", "context": "passage", "answer": "gold.value"}


def test_choices_make_a_multiple_choice_task_with_every_label_form(tmp_path):
    records = [
        {"id": "a", "question": "Sky?", "choices": ["green", "blue"], "label": 1},
        {"id": "b", "question": "Grass?", "choices": ["green", "blue"], "label": "A"},
        {"id": "c", "question": "Sea?", "choices": {"text": ["red", "blue"], "label": ["1", "2"]}, "label": "2"},
        {"id": "d", "question": "Snow?", "choices": ["white", "black"], "label": "white"},
        {"id": "e", "question": "Coal?", "choices": ["white", "black"], "label": "1"},
    ]
    task = get_task(f"jsonl:{write_jsonl(tmp_path / 'mc.jsonl', records)}")
    assert task.kind == "mc" and task.grader == "mc_letter/2"
    questions = task.load()
    assert [q.gold for q in questions] == ["B", "A", "B", "A", "B"]
    assert task.grade(questions[0], "B").correct and not task.grade(questions[0], "A").correct
    assert task.recognition_items(questions[0]) == ("Question: Sky?\nAnswer:", [" green", " blue"])
    assert "A. green\nB. blue" in task.prompt(questions[0], "shared", None)


def test_csv_columns_as_choices_and_parquet_lists(tmp_path):
    path = tmp_path / "quiz.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, ["question", "A", "B", "C", "answer"])
        writer.writeheader()
        writer.writerow({"question": "3 > 2?", "A": "yes", "B": "no", "C": "maybe", "answer": "A"})
        writer.writerow({"question": "1 > 2?", "A": "yes", "B": "no", "C": "maybe", "answer": "B"})
    task = get_task(f"csv:{path}", fields={"choices": "A,B,C", "label": "answer"})
    assert [(q.options, q.gold) for q in task.load()] == [(("yes", "no", "maybe"), "A"), (("yes", "no", "maybe"), "B")]
    table = pa.table({"problem": ["2 + 3?", "10 / 2?"], "answer": [["5", "five"], ["5"]]})
    pq.write_table(table, tmp_path / "sums.parquet")
    sums = get_task(f"parquet:{tmp_path / 'sums.parquet'}")
    assert [q.aliases for q in sums.load()] == [("5", "five"), ("5",)]


def test_number_and_math_graders(tmp_path):
    path = write_jsonl(tmp_path / "word.jsonl", [{"question": "Eggs?", "answer": "3 + 4 = 7\n#### 7"},
                                                  {"question": "Cost?", "answer": "1,200"}])
    numbers = get_task(f"jsonl:{path}", grader="number_final")
    eggs, cost = numbers.load()
    assert (eggs.gold, cost.gold) == ("7", "1200") and numbers.kind == "numeric"
    assert numbers.grade(eggs, "So 3 + 4 = 7.\nThe answer is: 7").correct and not numbers.grade(eggs, "8").correct
    half_file = write_jsonl(tmp_path / "m.jsonl", [{"problem": "Half?", "answer": "\\frac{1}{2}"}])
    maths = get_task(f"jsonl:{half_file}", grader="math_verify")
    (half,) = maths.load()
    assert maths.kind == "math" and maths.grade(half, "so \\boxed{0.5}").correct
    assert not maths.grade(half, "\\boxed{2}").correct


def test_shots_make_a_fewshot_format_recorded_by_hash(tmp_path):
    questions = write_jsonl(tmp_path / "qa.jsonl", QA)
    shots = write_jsonl(tmp_path / "shots.jsonl", [{"id": "s1", "question": "Colour of grass?", "answers": "green"}])
    task = get_task(f"jsonl:{questions}", shots=shots)
    assert task.formats == ("native", "shared", "fewshot") and task.default_format == "fewshot"
    q = task.load()[0]
    assert task.prompt(q, "fewshot", None) == ("Question: Colour of grass?\nAnswer: green\n\n"
                                               "Question: Capital of France?\nAnswer:")
    assert task.prompt_spec("fewshot").startswith("file:fewshot/1:sha256=")
    assert task.spec()["shots"]["file"] == "shots.jsonl"
    assert get_task(f"jsonl:{questions}").formats == ("native", "shared")
    overlapping = write_jsonl(tmp_path / "bad_shots.jsonl", [QA[0]])
    with pytest.raises(ValueError, match="the shot 'q1' is also a question of qa.jsonl"):
        get_task(f"jsonl:{questions}", shots=overlapping).load()


def test_the_protocol_records_the_file_by_hash_and_mapping(tmp_path):
    path = write_jsonl(tmp_path / "qa.jsonl", QA)
    task = get_task(f"jsonl:{path}")
    questions = task.load()
    p = Protocol.of(study="t", facts=FACTS, task=task, questions=questions, fmt="shared", probe="deploy")
    assert p.task == "qa" and p.task_spec["sha256"] and p.task_spec["grader"] == "short_answer_em"
    write_jsonl(path, [QA[0], {**QA[1], "answers": "4"}])  # the same ids, another gold: another file
    edited = get_task(f"jsonl:{path}")
    q = Protocol.of(study="t", facts=FACTS, task=edited, questions=edited.load(), fmt="shared", probe="deploy")
    assert "task_spec" in [name for name, *_ in p.diff(q)]
    remapped = get_task(f"jsonl:{path}", fields={"answer": "question"})
    assert remapped.spec()["fields"] != edited.spec()["fields"] and remapped.load()[1].gold == "Two plus two?"


@pytest.mark.parametrize("records, options, message", [
    ([{"question": "a?", "answer": "x"}, {"question": "", "answer": "y"}], {},
     r"bad.jsonl line 2: field 'question': missing or empty question"),
    ([{"question": "a?", "answer": "x"}, {"question": "b?", "answer": "  "}], {},
     r"bad.jsonl line 2: field 'answer': missing or empty answer"),
    ([{"question": "a?", "answer": "x"}, {"question": "b?"}], {}, r"bad.jsonl line 2: field 'answer': missing"),
    ([{"id": 1, "question": "a?", "answer": "x"}, {"id": 1, "question": "b?", "answer": "y"}], {},
     r"bad.jsonl line 2: duplicate question id '1' \(first seen at bad.jsonl line 1\)"),
    ([{"question": "a?", "answer": "x"}, {"question": "a?", "answer": "y"}], {},
     r"bad.jsonl line 2: duplicate question id .*: both rows hold the same question \(without an id field"),
    ([{"question": "a?", "choices": ["x", "y"], "label": 0}, {"question": "b?", "choices": ["x", "y"], "label": 2}],
     {}, r"bad.jsonl line 2: field 'label': label 2 out of range for 2 choices \(0..1\)"),
    ([{"question": "a?", "choices": ["x", "y"], "label": 0}, {"question": "b?", "answer": "x"}], {},
     r"bad.jsonl line 2: field 'choices': missing choices"),
    ([{"question": "a?", "answer": "x"}, {"question": "b?", "choices": ["x", "y"], "answer": "x"}], {},
     r"bad.jsonl line 2: field 'choices': this record has choices, the file's first record has none"),
    ([{"question": "a?", "answer": "x"}], {"grader": "number_final"},
     r"bad.jsonl line 1: field 'answer': answer 'x' is not a number"),
    ([{"question": "a?", "choices": ["x", "y"], "label": "Z"}], {},
     r"field 'label': label 'Z' is not a choice index \(0..1\), a letter \(A..B\)"),
])
def test_bad_rows_are_refused_naming_file_row_and_field(tmp_path, records, options, message):
    path = write_jsonl(tmp_path / "bad.jsonl", records)
    with pytest.raises(ValueError, match=message):
        get_task(f"jsonl:{path}", **options).load()


def test_bad_mappings_and_files(tmp_path):
    path = write_jsonl(tmp_path / "qa.jsonl", QA)
    with pytest.raises(ValueError, match=r"unknown field role\(s\) \['questoin'\]; valid: question, context"):
        get_task(f"jsonl:{path}", fields={"questoin": "question"})
    with pytest.raises(ValueError, match="unknown grader 'exact'; valid: mc_letter, short_answer_em, number_final"):
        get_task(f"jsonl:{path}", grader="exact")
    with pytest.raises(ValueError, match="grader mc_letter needs choices"):
        get_task(f"jsonl:{path}", grader="mc_letter")
    with pytest.raises(TypeError, match="fieds"):
        get_task(f"jsonl:{path}", fieds={})
    with pytest.raises(FileNotFoundError, match="does not exist"):
        get_task(f"jsonl:{tmp_path / 'absent.jsonl'}")
    nameless = write_jsonl(tmp_path / "nameless.jsonl", [{"prompt_text": "a?", "answer": "x"}])
    with pytest.raises(ValueError, match=r"no question field: none of .* \(fields present: \['answer', 'prompt_text'\]\)"):
        get_task(f"jsonl:{nameless}")
    with pytest.raises(ValueError, match="names no file after 'jsonl:'"):
        get_task("jsonl:")


def test_a_file_named_as_a_registered_task_gets_a_prefix(tmp_path):
    path = write_jsonl(tmp_path / "squad.jsonl", QA)
    assert get_task(f"jsonl:{path}").name == "file-squad"
    assert get_task(f"jsonl:{path}", name="mine").name == "mine"


def test_register_task_adds_a_name_and_refuses_a_duplicate():
    class Tiny(Task):
        name, kind, grader = "tiny_registered", "short_answer", "short_answer_em/1"

        def parse(self, data, split, index): ...
        def prompt(self, q, fmt, tokenizer): ...
        def max_new_tokens(self, fmt): return 4
        def stop_strings(self, fmt): return ()
        def grade(self, q, completion): ...

    register_task("tiny_registered", Tiny)
    assert "tiny_registered" in task_names() and isinstance(get_task("tiny_registered"), Tiny)
    with pytest.raises(ValueError, match="task 'tiny_registered' is already registered"):
        register_task("tiny_registered", Tiny)
    with pytest.raises(ValueError, match="must match"):
        register_task("jsonl:x", Tiny)


@needs_shared_data("gsm8k/test.jsonl", "arc/ARC-Easy-validation.jsonl")
def test_real_files_give_the_built_in_tasks_questions():
    """GSM8K's test.jsonl as a number_final file task and ARC-Easy's HF layout as a multiple-choice one give the
    built-in tasks' golds, options and verdicts on every question."""
    gsm = get_task(f"jsonl:{SHARED_DATA / 'gsm8k/test.jsonl'}", grader="number_final").load()
    builtin = get_task("gsm8k").load(SHARED_DATA / "gsm8k/test.jsonl")
    assert len(gsm) == len(builtin) == 1319
    assert [(q.question, q.gold) for q in gsm] == [(q.question, q.gold) for q in builtin]
    arc = get_task(f"jsonl:{SHARED_DATA / 'arc/ARC-Easy-validation.jsonl'}").load()
    arc_builtin = get_task("arc_easy").load(SHARED_DATA / "arc/ARC-Easy-validation.jsonl")
    assert [(q.id, q.question, q.options, q.gold) for q in arc] == \
        [(q.id, q.question, q.options, q.gold) for q in arc_builtin]


def test_an_installed_package_s_entry_point_registers_its_task(tmp_path, monkeypatch):
    """A package declaring ``[project.entry-points."reach_lens.tasks"] echo_task = "echo_pkg:EchoTask"`` is found
    by name, as every experiment's --task finds it, without an import of the package by hand."""
    import reach_lens.tasks as tasks

    (tmp_path / "echo_pkg.py").write_text(
        "class EchoTask:\n"
        "    def __new__(cls):\n"
        "        from reach_lens.tasks import get_task\n"
        f"        return get_task('jsonl:{write_jsonl(tmp_path / 'echo.jsonl', QA)}', name='echo_task')\n")
    info = tmp_path / "echo_pkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: echo-pkg\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[reach_lens.tasks]\necho_task = echo_pkg:EchoTask\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(tasks, "_loaded_entry_points", False)
    monkeypatch.setattr(tasks, "_FACTORIES", dict(tasks._FACTORIES))
    assert "echo_task" in task_names() and get_task("echo_task").load()[0].id == "q1"
