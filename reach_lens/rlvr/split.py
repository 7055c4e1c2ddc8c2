"""A training split disjoint by question id from the audit split: a salted id-hash rule, and its fingerprint.

    train, audit, split = split_questions(task.load(), "arc_easy", salt="rlvr", audit_share=0.6)
    split.to_dict()   # rule, salt, share, counts and the sha256 of each (sorted) id list

A question goes to the audit side when ``sha256("{salt}:{id}")`` read as a fraction of 2**256 is below
``audit_share``, else to training. The rule looks at the id only, so a question's side does not depend on
the other questions, their order or how many are loaded; both id lists' hashes go into the checkpoint's
metadata and the compare protocol's settings, and ``check_disjoint`` refuses an audit that shares an id
with a checkpoint's training questions.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from reach_lens.protocol import canonical_json

RULE = "audit iff int(sha256(f'{salt}:{question_id}'), 16) / 2**256 < audit_share"


def id_fraction(salt: str, question_id: str) -> float:
    """``sha256("{salt}:{question_id}")`` as a number in [0, 1)."""
    return int(hashlib.sha256(f"{salt}:{question_id}".encode()).hexdigest(), 16) / 2**256


def ids_hash(ids: Iterable[str]) -> str:
    """sha256 hex of the sorted, de-duplicated id list (canonical JSON): the fingerprint of one side."""
    return hashlib.sha256(canonical_json(sorted({str(i) for i in ids})).encode()).hexdigest()


@dataclass(frozen=True)
class Split:
    """One task's questions split by the salted id hash; ``train_ids`` and ``audit_ids`` are sorted."""

    task: str
    salt: str
    audit_share: float
    train_ids: tuple[str, ...]
    audit_ids: tuple[str, ...]

    def to_dict(self) -> dict:
        """The rule and both lists' fingerprints (not the lists): what protocols and metadata record."""
        return {"task": self.task, "rule": RULE, "salt": self.salt, "audit_share": self.audit_share,
                "n_train": len(self.train_ids), "n_audit": len(self.audit_ids),
                "train_ids_sha256": ids_hash(self.train_ids), "audit_ids_sha256": ids_hash(self.audit_ids)}


def split_questions(questions: Sequence[Any], task: str, salt: str = "rlvr",
                    audit_share: float = 0.6) -> tuple[list, list, Split]:
    """(training questions, audit questions, the Split), each side in the input order."""
    if not 0 < audit_share < 1:
        raise ValueError(f"audit_share {audit_share} out of range: expected a number strictly between 0 and 1")
    if not salt:
        raise ValueError("salt is empty: the split rule needs a non-empty salt")
    ids = [str(q.id) for q in questions]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{task}: duplicate question ids; a split by id needs unique ids")
    audit = [q for q in questions if id_fraction(salt, str(q.id)) < audit_share]
    train = [q for q in questions if id_fraction(salt, str(q.id)) >= audit_share]
    if not audit or not train:
        raise ValueError(f"{task}: the split left {len(train)} training and {len(audit)} audit questions "
                         f"(audit_share {audit_share}, {len(questions)} questions): both sides need some")
    split = Split(task, salt, float(audit_share), tuple(sorted(str(q.id) for q in train)),
                  tuple(sorted(str(q.id) for q in audit)))
    return train, audit, split


def check_disjoint(audit_ids: Iterable[str], train_ids: Iterable[str], what: str = "checkpoint") -> None:
    """Refuse an audit whose questions include any of a checkpoint's training questions, naming some."""
    shared = sorted(set(map(str, audit_ids)) & set(map(str, train_ids)))
    if shared:
        raise ValueError(f"{len(shared)} audit question(s) were training questions of the {what} "
                         f"(e.g. {shared[:5]}): the audit split must be disjoint by question id from the "
                         "training split")
