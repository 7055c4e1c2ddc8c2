"""Greedy answers of the panel questions under named conditions, stored per question as they are computed.

    conditions = Conditions(model, task, "native", store, panels, questions)
    conditions.run("silence-mlp-12", [Silence(12, "hook_mlp_out")], "calibration")   # both panels
    conditions.run("steer-4-12", [Steer(12, v, -4.0)], "evaluation", panels=("failure",))
    conditions.rates("silence-mlp-12", "calibration")    # repair, breakage with Wilson intervals

A condition's answers are one store part (table ``conditions``, key ``row_key = "condition|question_id"``):
a killed run loses at most the condition in progress, and a rerun computes only what is missing. The
generation engine reuses each prompt's clean prefix, so a condition at layer l prefills only layers >= l.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pandas as pd
from transformer_lens import HookedTransformer

from reach_lens import probes, stats
from reach_lens.interventions import Intervention
from reach_lens.localize.panels import PANELS, ROLES
from reach_lens.store import RunStore
from reach_lens.tasks import Question, Task

TABLE = "conditions"
COLUMNS = ["row_key", "condition", "interventions", "role", "panel", "question_id", "correct", "answer"]


def panel_rates(results: pd.DataFrame) -> dict:
    """Repair and breakage of one condition from its per-question results (columns panel, correct).

    Repair = share of the failure panel answered correctly; breakage = share of the healthy panel answered
    wrongly; each with its Wilson 95% interval, count and n (``stats.Rate.to_dict``). An empty panel gives
    NaN rates with n = 0.
    """
    out = {}
    for name, panel, rate in (("repair", "failure", stats.repair_rate), ("breakage", "healthy", stats.breakage_rate)):
        after = results.loc[results.panel == panel, "correct"].to_numpy(bool)
        if len(after):
            out.update(rate(np.full(len(after), panel == "healthy"), after).to_dict(name))
        else:
            out.update({name: np.nan, f"{name}_lo": np.nan, f"{name}_hi": np.nan, f"{name}_n": 0, f"{name}_k": 0})
    return out


class Conditions:
    """Per-question greedy results of the study's panels under named interventions (module docstring)."""

    def __init__(self, model: HookedTransformer, task: Task, fmt: str, store: RunStore, panels: pd.DataFrame,
                 questions: Sequence[Question], batch_size: int = 16):
        self.model, self.task, self.fmt, self.store, self.batch_size = model, task, fmt, store, batch_size
        by_id = {q.id: q for q in questions}
        missing = sorted(set(panels.question_id) - set(by_id))
        if missing:
            raise ValueError(f"{len(missing)} panel questions are not among the questions given, e.g. {missing[:3]}")
        self.panels = panels
        self.by_id = by_id
        stored = store.read(TABLE, key="row_key")
        self.results = stored if len(stored) else pd.DataFrame(columns=COLUMNS)

    def questions(self, role: str, panels: Sequence[str] = PANELS) -> list[Question]:
        """The questions of ``role`` in ``panels``, in panel order."""
        if role not in ROLES or not set(panels) <= set(PANELS):
            raise ValueError(f"role {role!r} / panels {list(panels)}: expected a role in {ROLES}, panels in {PANELS}")
        chosen = self.panels[(self.panels.role == role) & self.panels.panel.isin(list(panels))]
        return [self.by_id[i] for i in chosen.question_id]

    def run(self, condition: str, interventions: Sequence[Intervention], role: str,
            panels: Sequence[str] = PANELS) -> pd.DataFrame:
        """Answer the questions of ``role`` in ``panels`` under ``interventions`` (only those not stored yet);
        return the condition's rows for them."""
        if "|" in condition:
            raise ValueError(f"condition name {condition!r} must not contain '|'")
        wanted = self.questions(role, panels)
        done = set(self.results.row_key[self.results.condition == condition])
        todo = [q for q in wanted if f"{condition}|{q.id}" not in done]
        if todo:
            deployed = self.answer(todo, interventions)
            spec = json.dumps([i.to_dict() for i in interventions])
            panel_of = dict(zip(self.panels.question_id, self.panels.panel))
            rows = [{"row_key": f"{condition}|{q.id}", "condition": condition, "interventions": spec, "role": role,
                     "panel": panel_of[q.id], "question_id": q.id, "correct": bool(d["correct"]),
                     "answer": d["answer"]} for q, d in zip(todo, deployed)]
            self.store.append(TABLE, rows)
            self.results = pd.concat([self.results, pd.DataFrame(rows, columns=COLUMNS)], ignore_index=True)
        return self.rows(condition, role, panels)

    def answer(self, questions: Sequence[Question], interventions: Sequence[Intervention]) -> list[dict]:
        """Greedy answers (candidate dicts with ``correct`` and ``answer``) of ``questions`` under ``interventions``."""
        return probes.deploy(self.model, self.task, questions, self.fmt, interventions=interventions,
                             batch_size=self.batch_size)

    def rows(self, condition: str, role: str, panels: Sequence[str] = PANELS) -> pd.DataFrame:
        """Stored rows of ``condition`` for the questions of ``role`` in ``panels``, in panel order."""
        ids = [q.id for q in self.questions(role, panels)]
        mine = self.results[self.results.condition == condition].set_index("question_id")
        absent = [i for i in ids if i not in mine.index]
        if absent:
            raise KeyError(f"condition {condition!r} has no results for {len(absent)} {role} questions; run it first")
        return mine.loc[ids].reset_index()

    def rates(self, condition: str, role: str, panels: Sequence[str] = PANELS) -> dict:
        """Repair (failure panel) and breakage (healthy panel) of ``condition`` on the ``role`` questions."""
        return panel_rates(self.rows(condition, role, panels))

    def correct(self, condition: str, role: str, panel: str) -> pd.Series:
        """Whether each question of (role, panel) is answered correctly under ``condition`` (index question_id)."""
        rows = self.rows(condition, role, (panel,))
        return pd.Series(rows.correct.astype(bool).to_numpy(), index=rows.question_id, name=condition)
