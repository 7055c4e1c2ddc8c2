"""Tasks from a user's own file: ``jsonl:PATH`` (also ``json:``, ``csv:``, ``parquet:``), no task class to write.

    task = file_task("my_qa.jsonl")                                       # fields found in the common layouts
    task = file_task("mmlu.csv", fields={"choices": "A,B,C,D", "label": "answer"})
    task = file_task("gsm8k/test.jsonl", grader="number_final", shots="gsm8k/shots.jsonl")
    task = get_task("jsonl:my_qa.jsonl", grader="short_answer_em")        # the same through the registry

**Fields.** ``fields`` maps a role to the record's field (a dotted path reads nested objects: ``"answer.value"``;
``choices`` may also name several columns: ``"A,B,C,D"``). An unmapped role takes the first of ``FIELD_DEFAULTS``
present in the file's first record:

- ``question`` (required): the question text;
- ``context`` (optional): a passage shown before the question;
- ``answer``: the gold answer, one string or a list of accepted aliases (free-form graders);
- ``choices`` + ``label``: the options (a list of strings, or ``{"text": [...], "label": [...]}`` as in the Hugging
  Face ARC layout) and the gold: a 0-based index (an int or its digits), a letter ``A``.., one of the file's
  choice labels (``answerKey``), or the gold option's text;
- ``id`` (optional): else ``<name>-<12 hex of sha256(context, question)>``, stable across edits of other rows.

**Graders** (``GRADERS``, chosen by ``grader`` or inferred: choices in the first record -> ``mc_letter``, else
``short_answer_em``): ``mc_letter`` (the option letter), ``short_answer_em`` (SQuAD-normalized exact match against
every alias), ``number_final`` (the final number; a gold such as GSM8K's ``"... #### 18"`` is read after its last
``####``), ``math_verify`` (math-verify equivalence). Each is the built-in tasks' rule under the same name and
version, so a file task and a built-in task of the same data grade alike.

**Formats**: the grader family's ``native`` (chat template) and ``shared`` (plain text), and ``fewshot`` when
``shots`` names a second file of solved examples in the same layout: ``"Question: ...\\nAnswer: <gold>"`` blocks
before every question (a numeric or math shot shows its answer field as written, e.g. a worked solution). A shot
whose id is among the questions is refused.

**Checks**: every record is read and checked when the task loads, before anything runs: a missing or empty question
or answer, a label out of range, a duplicate id, a record of another kind than the first (choices in some records
only), a ``number_final`` answer that is not a number: each raises ``ValueError`` naming the file, the row and the
field. ``spec()`` (the protocol's ``task_spec``) holds the file's name, reader and sha256, the resolved field
mapping, the grader and the shots' file and sha256.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from reach_lens.tasks import sources
from reach_lens.tasks.base import Graded, MalformedRow, Question, ReasoningTask, Task
from reach_lens.tasks.dart import GRADER as MATH_GRADER
from reach_lens.tasks.dart import MAX_NEW_TOKENS as MATH_MAX_NEW_TOKENS
from reach_lens.tasks.dart import NATIVE_INSTRUCTION as MATH_NATIVE, SHARED_INSTRUCTION as MATH_SHARED
from reach_lens.tasks.dart import equivalent, extract_answer
from reach_lens.tasks.gsm8k import GRADER as NUMBER_GRADER
from reach_lens.tasks.gsm8k import MAX_NEW_TOKENS as NUMBER_MAX_NEW_TOKENS
from reach_lens.tasks.gsm8k import NATIVE_INSTRUCTION as NUMBER_NATIVE, SHARED_INSTRUCTION as NUMBER_SHARED
from reach_lens.tasks.gsm8k import GSM8KTask, normalize_number
from reach_lens.tasks.mc import LETTERS, MCTask, make_mc_question, options_block
from reach_lens.tasks.short_answer import ShortAnswerTask, unique_aliases
from reach_lens.tasks.sources import Row

READERS = {".jsonl": "jsonl", ".json": "json", ".csv": "csv", ".parquet": "parquet"}  # file suffix -> reader
ROLES = ("question", "context", "answer", "choices", "label", "id")
FIELD_DEFAULTS: dict[str, tuple[str, ...]] = {
    "question": ("question", "problem", "prompt", "query", "input", "goal", "Question", "text"),
    "context": ("context", "passage", "support", "background"),
    "answer": ("answers", "answer", "aliases", "target", "targets", "gold", "output", "final_answer", "Answer"),
    "choices": ("choices", "options", "endings"),
    "label": ("label", "answerKey", "answer_idx", "answer_index", "gold_index", "correct_option", "answer", "target",
              "gold"),
    "id": ("id", "question_id", "qid", "uid", "unique_id", "idx"),
}
GRADERS = {"mc_letter": MCTask.grader, "short_answer_em": ShortAnswerTask.grader, "number_final": NUMBER_GRADER,
           "math_verify": MATH_GRADER}
_MISSING = object()


def reader_of(path: Path, reader: str | None = None) -> str:
    """The reader of ``path``: ``reader`` when given (one of ``READERS``' values), else the file's suffix's."""
    readers = sorted(set(READERS.values()))
    if reader is not None:
        if reader not in readers:
            raise ValueError(f"unknown file reader {reader!r}; valid: {', '.join(readers)}")
        return reader
    if path.suffix.lower() not in READERS:
        raise ValueError(f"{path.name}: cannot tell how to read a {path.suffix or 'suffix-less'} file; expected one of "
                         f"{', '.join(READERS)} (or name the reader: jsonl:PATH, json:, csv:, parquet:)")
    return READERS[path.suffix.lower()]


def file_rows(path: Path, reader: str) -> Iterator[Row]:
    """Rows of a user's file: JSON lines, a JSON array, CSV with a header row, or Parquet."""
    if reader == "jsonl":
        yield from sources.jsonl_rows(path)
    elif reader == "json":
        yield from sources.json_array_rows(path)
    elif reader == "csv":
        with open(path, newline="", encoding="utf-8") as f:
            records = csv.DictReader(f)
            for i, record in enumerate(records, start=1):
                yield Row(f"{path.name} row {i} (line {records.line_num})", i, dict(record))
    else:
        import pyarrow.parquet as pq

        for i, record in enumerate(pq.read_table(path).to_pylist(), start=1):
            yield Row(f"{path.name} row {i}", i, record)


def field_value(record: Mapping, path: str) -> Any:
    """The value of field ``path`` of ``record``, or at its dotted path (``"answer.value"``), or ``_MISSING``."""
    if path in record:
        return record[path]
    value: Any = record
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return _MISSING
        value = value[part]
    return value


def resolve_fields(first: Any, fields: Mapping[str, str] | None, grader: str | None,
                   where: str) -> tuple[dict[str, str], str]:
    """(the field of each role, the grader): roles given in ``fields``, else the first default present in the first
    record; the grader given, else ``mc_letter`` when the first record has choices and ``short_answer_em`` when not.
    A multiple-choice task has no answer role, a free-form one no choices or label."""
    fields = dict(fields or {})
    if "answers" in fields:
        fields["answer"] = fields.pop("answers")
    unknown = sorted(set(fields) - set(ROLES))
    if unknown:
        raise ValueError(f"unknown field role(s) {unknown}; valid: {', '.join(ROLES)} (or 'answers' for 'answer')")
    if grader is not None and grader not in GRADERS:
        raise ValueError(f"unknown grader {grader!r}; valid: {', '.join(GRADERS)}")
    if not isinstance(first, Mapping):
        raise ValueError(f"{where}: expected a record of named fields (a JSON object, a CSV row), got "
                         f"{type(first).__name__}")

    def find(role: str, taken: Sequence[str]) -> str | None:
        if role in fields:
            return fields[role]
        return next((name for name in FIELD_DEFAULTS[role]
                     if field_value(first, name) is not _MISSING and name not in taken), None)

    resolved: dict[str, str] = {}
    for role in ("question", "context", "id", "choices"):
        if (found := find(role, list(resolved.values()))) is not None:
            resolved[role] = found
    if "question" not in resolved:
        raise ValueError(f"{where}: no question field: none of {list(FIELD_DEFAULTS['question'])} (fields present: "
                         f"{sorted(first)}); name it, e.g. fields={{'question': '<field>'}} "
                         "(--fields question=<field>)")
    grader = grader or ("mc_letter" if "choices" in resolved else "short_answer_em")
    if grader == "mc_letter":
        if "choices" not in resolved:
            raise ValueError(f"{where}: grader mc_letter needs choices: none of {list(FIELD_DEFAULTS['choices'])}; "
                             "name them (--fields choices=<field>, or choices=A,B,C,D for one column each)")
        found = find("label", list(resolved.values()))
        if found is None:
            raise ValueError(f"{where}: no label field: none of {list(FIELD_DEFAULTS['label'])}; name it "
                             "(--fields label=<field>)")
        resolved["label"] = found
    else:
        resolved.pop("choices", None)
        found = find("answer", list(resolved.values()))
        if found is None:
            raise ValueError(f"{where}: no answer field: none of {list(FIELD_DEFAULTS['answer'])}; name it "
                             "(--fields answer=<field>)")
        resolved["answer"] = found
    return resolved, grader


def _text(value: Any) -> str:
    if value is _MISSING or value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).strip()


def _listed(value: Any) -> Any:
    """A CSV cell holding a JSON list (``'["a", "b"]'``) as the list; other values unchanged."""
    if isinstance(value, str) and value.strip().startswith("["):
        try:
            parsed = json.loads(value)
        except ValueError:
            return value
        return parsed if isinstance(parsed, list) else value
    return value


def gold_index(label: Any, options: Sequence[str], file_labels: Sequence[str], field: str) -> int:
    """The gold option's position (module docstring: an index, a letter, a file label or the option's text)."""
    m = len(options)
    if isinstance(label, bool) or label is _MISSING or label is None or _text(label) == "":
        raise MalformedRow(f"field {field!r}: missing or empty label")
    text = _text(label)
    if file_labels and text in file_labels:
        return list(file_labels).index(text)
    if re.fullmatch(r"\d+", text):
        index = int(text)
        if not 0 <= index < m:
            raise MalformedRow(f"field {field!r}: label {label!r} out of range for {m} choices (0..{m - 1})")
        return index
    if len(text) == 1 and text.upper() in LETTERS[:m]:
        return LETTERS.index(text.upper())
    matches = [i for i, o in enumerate(options) if o.strip() == text]
    if len(matches) == 1:
        return matches[0]
    raise MalformedRow(f"field {field!r}: label {label!r} is not a choice index (0..{m - 1}), a letter "
                       f"(A..{LETTERS[m - 1]}){', a choice label ' + str(list(file_labels)) if file_labels else ''} "
                       "or one option's text")


class FileTask(Task):
    """What every file task shares: reading and checking the file, ids, shots and the spec (module docstring).
    The grader's family (a subclass below) supplies prompts and grading."""

    grader_name: str
    shot_answer_field = False  # a shot shows its answer field as written (worked solutions), not the gold

    def __init__(self, path: Path, reader: str, fields: dict[str, str], name: str, shots: Path | None,
                 foreign_fields: Sequence[str] = ()):
        """``foreign_fields``: fields that mark a record of another kind (choices in a free-form file)."""
        super().__init__()
        self.path, self.reader, self.fields, self.name, self.shots_path = path, reader, fields, name, shots
        self.foreign_fields = tuple(foreign_fields)
        self.grader = GRADERS[self.grader_name]
        self.default_split = "test"
        self.formats = (*type(self).formats, "fewshot") if shots is not None else type(self).formats
        self.default_format = "fewshot" if shots is not None else "native"
        self._sha256 = sources.sha256_file(path)
        self._shots = self._shot_block() if shots is not None else None

    # ---- loading -------------------------------------------------------------------------------

    def load(self, source=None, split=None, *, skip_malformed: bool = False) -> list[Question]:
        """Every question of the file (``source`` and ``split`` do not apply: the task is its file)."""
        if source is not None:
            raise ValueError(f"task {self.name!r} reads {self.path}; a source {source!r} does not apply to it")
        try:
            questions = self._parse_all(file_rows(self.path, self.reader), split or self.default_split,
                                        skip_malformed, str(self.path))
        except ValueError as err:
            if "id" in self.fields or "duplicate question id" not in str(err):
                raise
            raise ValueError(f"{err}: both rows hold the same question (without an id field, a question's id is a "
                             "hash of its context and text): give the rows an 'id' field, or drop the repeat") from None
        if self._shots is not None:
            asked = {q.id for q in questions}
            for shot in self._shots[1]:
                if shot in asked:
                    raise ValueError(f"{self.shots_path.name}: the shot {shot!r} is also a question of "
                                     f"{self.path.name}: held-out shots must not be asked")
        return questions

    def parse(self, data: Any, split: str, index: int) -> Question:
        if not isinstance(data, Mapping):
            raise MalformedRow(f"expected a record of named fields, got {type(data).__name__}")
        question = _text(field_value(data, self.fields["question"]))
        if not question:
            raise MalformedRow(f"field {self.fields['question']!r}: missing or empty question")
        context = _text(field_value(data, self.fields["context"])) if "context" in self.fields else ""
        qid = _text(field_value(data, self.fields["id"])) if "id" in self.fields else ""
        if "id" in self.fields and not qid:
            raise MalformedRow(f"field {self.fields['id']!r}: missing or empty id")
        if not qid:
            key = f"{context}\n{question}".encode()
            qid = f"{self.name}-{hashlib.sha256(key).hexdigest()[:12]}"
        return self.make_question(data, qid, question, context)

    def make_question(self, data: Mapping, qid: str, question: str, context: str) -> Question:
        """The family's question of one record (gold parsed and checked)."""
        raise NotImplementedError

    def _answers(self, data: Mapping) -> tuple[str, ...]:
        field = self.fields["answer"]
        mixed = [name for name in self.foreign_fields if field_value(data, name) is not _MISSING]
        if mixed:
            raise MalformedRow(f"field {mixed[0]!r}: this record has choices, the file's first record has none: one "
                               "file holds one kind of question (multiple choice, or free-form answers)")
        value = _listed(field_value(data, field))
        values = value if isinstance(value, (list, tuple)) else [value]
        aliases = unique_aliases([_text(v) for v in values if v is not _MISSING])
        if not aliases:
            raise MalformedRow(f"field {field!r}: missing or empty answer")
        return aliases

    # ---- shots and spec ------------------------------------------------------------------------

    def _shot_block(self) -> tuple[str, tuple[str, ...]]:
        """(the few-shot text, the shots' ids) of the shots file, read with this file's fields."""
        reader = reader_of(self.shots_path)
        block, ids = [], []
        for row in file_rows(self.shots_path, reader):
            try:
                if row.error is not None:
                    raise MalformedRow(row.error)
                shot = self.parse(row.data, "shots", row.index)
                answer = _text(field_value(row.data, self.fields["answer"])) if self.shot_answer_field else shot.gold
            except MalformedRow as err:
                raise ValueError(f"shots file {row.where}: {err}") from None
            block.append(self.shot_text(shot, answer))
            ids.append(shot.id)
        if not block:
            raise ValueError(f"shots file {self.shots_path} holds no records")
        return "".join(block), tuple(ids)

    def shot_text(self, shot: Question, answer: str) -> str:
        return f"Question: {shot.question}\nAnswer: {answer}\n\n"

    def spec(self) -> dict:
        shots = None if self.shots_path is None else {"file": self.shots_path.name,
                                                      "sha256": sources.sha256_file(self.shots_path)}
        return {"kind": "file", "file": self.path.name, "reader": self.reader, "sha256": self._sha256,
                "fields": dict(self.fields), "grader": self.grader_name, "shots": shots}

    def prompt_spec(self, fmt: str) -> str | None:
        self.check_format(fmt)
        if fmt != "fewshot":
            return None
        return f"file:fewshot/1:sha256={hashlib.sha256(self._shots[0].encode()).hexdigest()[:16]}"


class MCFileTask(FileTask, MCTask):
    grader_name = "mc_letter"

    def make_question(self, data, qid, question, context):
        field = self.fields["choices"]
        names = [name.strip() for name in field.split(",")]
        if len(names) > 1:
            values = [field_value(data, name) for name in names]
            options, file_labels = [_text(v) for v in values], []
        else:
            value = _listed(field_value(data, field))
            if value is _MISSING:
                raise MalformedRow(f"field {field!r}: missing choices (the file's first record has them: one file "
                                   "holds one kind of question)")
            if isinstance(value, Mapping) and isinstance(value.get("text"), list):
                options, file_labels = [_text(o) for o in value["text"]], [_text(x) for x in value.get("label") or []]
            elif isinstance(value, (list, tuple)):
                options, file_labels = [_text(o) for o in value], []
            else:
                raise MalformedRow(f"field {field!r}: choices must be a list of strings or {{'text': [...], "
                                   f"'label': [...]}}, got {type(value).__name__}")
        label_field = self.fields["label"]
        index = gold_index(field_value(data, label_field), options, file_labels, label_field)
        try:
            return make_mc_question(qid, f"{context}\n{question}" if context else question, options, index)
        except MalformedRow as err:
            raise MalformedRow(f"field {field!r}: {err}") from None

    def shot_text(self, shot, answer):
        return f"Question: {shot.question}\n{options_block(shot)}\nAnswer: {answer}\n\n"

    def prompt(self, q, fmt, tokenizer):
        self.check_format(fmt)
        if fmt == "fewshot":
            return self._shots[0] + MCTask.prompt(self, q, "shared", tokenizer)
        return super().prompt(q, fmt, tokenizer)

    def max_new_tokens(self, fmt):
        self.check_format(fmt)
        return super().max_new_tokens("shared" if fmt == "fewshot" else fmt)

    def stop_strings(self, fmt):
        self.check_format(fmt)
        return super().stop_strings("shared" if fmt == "fewshot" else fmt)


class ShortAnswerFileTask(FileTask, ShortAnswerTask):
    grader_name = "short_answer_em"
    formats = ("native", "shared")

    def make_question(self, data, qid, question, context):
        aliases = self._answers(data)
        return Question(qid, question, aliases[0], context=context, aliases=aliases)

    def query(self, q):
        return f"{q.context}\nQuestion: {q.question}\nAnswer:" if q.context else f"Question: {q.question}\nAnswer:"

    def native_content(self, q):
        text = f"{q.context}\n\nQuestion: {q.question}" if q.context else q.question
        return f"{text}\n\n{self.native_instruction}"

    def shot_text(self, shot, answer):
        return f"{self.query(shot)} {answer}\n\n"

    def shots(self):
        return self.shots_path.name, self._shots[0]

    def prompt_spec(self, fmt):
        return FileTask.prompt_spec(self, fmt)


class ReasoningFileTask(FileTask, ReasoningTask):
    """Numeric and math answers after a chain of thought; ``fewshot`` as GSM8K's (stops at the next question)."""

    shot_answer_field = True

    def prompt(self, q, fmt, tokenizer):
        self.check_format(fmt)
        if fmt == "fewshot":
            return f"{self._shots[0]}Question: {q.question}\nAnswer:"
        return super().prompt(q, fmt, tokenizer)

    def max_new_tokens(self, fmt):
        self.check_format(fmt)
        return self.reasoning_max_new_tokens

    def stop_strings(self, fmt):
        self.check_format(fmt)
        return ("Question:", "\n\n") if fmt == "fewshot" else super().stop_strings(fmt)


class NumberFileTask(ReasoningFileTask):
    grader_name = "number_final"
    kind = "numeric"
    native_instruction, shared_instruction = NUMBER_NATIVE, NUMBER_SHARED
    reasoning_max_new_tokens = NUMBER_MAX_NEW_TOKENS

    def make_question(self, data, qid, question, context):
        raw = self._answers(data)[0]
        value = raw.split("####")[-1].strip()
        gold = normalize_number(value)
        if gold is None:
            raise MalformedRow(f"field {self.fields['answer']!r}: answer {value!r} is not a number "
                               "(grader number_final)")
        return Question(qid, f"{context}\n{question}" if context else question, gold)

    grade = GSM8KTask.grade


class MathFileTask(ReasoningFileTask):
    grader_name = "math_verify"
    kind = "math"
    native_instruction, shared_instruction = MATH_NATIVE, MATH_SHARED
    reasoning_max_new_tokens = MATH_MAX_NEW_TOKENS

    def make_question(self, data, qid, question, context):
        return Question(qid, f"{context}\n{question}" if context else question, self._answers(data)[0])

    def grade(self, q: Question, completion: str) -> Graded:
        answer = extract_answer(completion)
        if answer is None:
            return Graded(None, False)
        answer = re.sub(r"\s+", " ", answer).strip()
        return Graded(answer, equivalent(q.gold, answer, q.question))


FAMILIES = {cls.grader_name: cls for cls in (MCFileTask, ShortAnswerFileTask, NumberFileTask, MathFileTask)}


def file_task(path: str | Path, *, fields: Mapping[str, str] | None = None, grader: str | None = None,
              shots: str | Path | None = None, reader: str | None = None, name: str | None = None,
              taken: Sequence[str] = ()) -> FileTask:
    """The task of a user's file (module docstring). ``reader``: ``jsonl``, ``json``, ``csv`` or ``parquet`` (default:
    from the suffix); ``name``: the task's name in run directories and protocols (default: the file's stem, prefixed
    ``file-`` when it is one of ``taken``, the registered task names). Raises ``FileNotFoundError`` or
    ``ValueError`` naming the file, row and field of what cannot be read."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"task file {str(path)!r} does not exist")
    reader = reader_of(path, reader)
    first = next(iter(file_rows(path, reader)), None)
    if first is None:
        raise ValueError(f"{path.name} holds no records")
    if first.error is not None:
        raise ValueError(f"{first.where}: {first.error}")
    resolved, grader = resolve_fields(first.data, fields, grader, first.where)
    inferred_free = grader != "mc_letter" and not any(field_value(first.data, n) is not _MISSING
                                                        for n in FIELD_DEFAULTS["choices"])
    if name is None:
        name = re.sub(r"[^A-Za-z0-9_.-]+", "-", path.stem).strip("-.") or "file"
        name = f"file-{name}" if name in taken else name
    shots_path = None if shots is None else Path(shots).expanduser()
    if shots_path is not None and not shots_path.is_file():
        raise FileNotFoundError(f"shots file {str(shots_path)!r} does not exist")
    return FAMILIES[grader](path, reader, resolved, name, shots_path,
                            FIELD_DEFAULTS["choices"] if inferred_free else ())
