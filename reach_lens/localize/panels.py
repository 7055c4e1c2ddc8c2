"""The screen and the panels, fixed before any intervention.

A question is *recognized* when multiple-choice likelihood ranks its gold option first and *generated* when
greedy direct generation answers it correctly. The **failure set** holds questions recognized but not
generated. The **healthy panel** holds, by ``healthy_rule``, every question generated correctly (the
paper's "already-correct" questions, default) or only those also recognized. Each panel is split by a hash
of the question id into calibration questions (they choose the layer, the runner-ups, the steering doses,
the direction and the units) and evaluation questions (every reported number is measured on them).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import pandas as pd
from transformer_lens import HookedTransformer

from reach_lens import probes
from reach_lens.errors import UserError
from reach_lens.interventions import Intervention
from reach_lens.tasks import Question, Task

RECOGNITION_RULES = ("sum", "norm")
HEALTHY_RULES = ("already-correct", "recognized-and-correct")
HEALTHY_RULE_TEXT = {"already-correct": "generated correctly (the paper's already-correct questions)",
                     "recognized-and-correct": "recognized and generated correctly"}
PANELS = ("failure", "healthy")
ROLES = ("calibration", "evaluation")


def screen(model: HookedTransformer, task: Task, questions: Sequence[Question], fmt: str,
           recognition: str = "sum", interventions: Sequence[Intervention] = (), batch_size: int = 16,
           recognize: str = "all") -> pd.DataFrame:
    """Recognition and direct generation of every question under ``interventions``, one row each.

    Columns: question_id, gold, recognized (gold option ranked first by summed ("sum") or per-token
    ("norm") option log-likelihood), recog_pred, generated (greedy answer graded correct), gen_answer,
    gen_text, gen_format_ok. ``recognize="generated"`` runs recognition only on the questions generated
    correctly (``recognized`` and ``recog_pred`` are None for the others): all a positive control's pool needs.
    """
    if recognition not in RECOGNITION_RULES:
        raise ValueError(f"recognition rule {recognition!r} unknown; expected one of {RECOGNITION_RULES}")
    if recognize not in ("all", "generated"):
        raise ValueError(f"recognize {recognize!r} unknown; expected 'all' or 'generated'")
    if task.kind != "mc":
        raise ValueError(f"task {task.name!r} is {task.kind}; recognition needs a multiple-choice task")
    deployed = probes.deploy(model, task, questions, fmt, interventions=interventions, batch_size=batch_size)
    measured = [q for q, gen in zip(questions, deployed) if recognize == "all" or gen["correct"]]
    recog = pd.DataFrame(probes.recognize(model, task, measured, interventions=interventions, batch_size=batch_size),
                         columns=["question_id", "pred_sum", "pred_norm"]).set_index("question_id")
    pred_column = "pred_sum" if recognition == "sum" else "pred_norm"
    rows = []
    for q, gen in zip(questions, deployed):
        pred = int(recog.loc[q.id, pred_column]) if q.id in recog.index else None
        rows.append({"question_id": q.id, "gold": q.gold,
                     "recognized": None if pred is None else pred == q.gold_index,
                     "recog_pred": None if pred is None else q.labels[pred], "generated": bool(gen["correct"]),
                     "gen_answer": gen["answer"], "gen_text": gen["text"], "gen_format_ok": gen["answer"] is not None})
    return pd.DataFrame(rows)


def split_value(seed: int, question_id: str) -> float:
    """``sha256("panel-split:seed:id")`` read as a number in [0, 1): below the calibration share = calibration."""
    digest = hashlib.sha256(f"panel-split:{seed}:{question_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def panel_masks(screened: pd.DataFrame, healthy_rule: str = "already-correct",
                exclude_format_failures: bool = False) -> dict[str, pd.Series]:
    """Boolean masks over ``screened`` rows: the failure set and the healthy panel under ``healthy_rule``; with
    ``exclude_format_failures`` the failure set leaves out greedy answers no letter was read from
    (``gen_format_ok`` False: the model said something, not a wrong option)."""
    if healthy_rule not in HEALTHY_RULES:
        raise ValueError(f"healthy rule {healthy_rule!r} unknown; expected one of {HEALTHY_RULES}")
    recognized, generated = screened.recognized.astype(bool), screened.generated.astype(bool)
    healthy = generated if healthy_rule == "already-correct" else recognized & generated
    failure = recognized & ~generated
    if exclude_format_failures:
        failure &= screened.gen_format_ok.astype(bool)
    return {"failure": failure, "healthy": healthy}


def format_failures(screened: pd.DataFrame, ids) -> int:
    """How many of the questions ``ids`` have a greedy answer no letter was read from (``gen_format_ok`` False)."""
    ok = screened.set_index("question_id").gen_format_ok.astype(bool)
    return int((~ok.loc[list(ids)]).sum())


def build_panels(screened: pd.DataFrame, seed: int, calibration_share: float = 0.5,
                 max_evaluation: int | None = None, max_calibration: int | None = None,
                 healthy_rule: str = "already-correct", exclude_format_failures: bool = False) -> pd.DataFrame:
    """Failure set and healthy panel (``panel_masks``), each split into calibration and evaluation questions.

    The split depends on the id only (``split_value``), so it is independent of question order. The caps keep
    the lowest split values of each (panel, role); questions beyond a cap are left out of the study.
    Columns: question_id, panel ("failure" | "healthy"), role ("calibration" | "evaluation").
    """
    if not 0.0 < calibration_share < 1.0:
        raise ValueError(f"calibration_share {calibration_share} out of range: expected 0 < share < 1")
    caps = {"calibration": max_calibration, "evaluation": max_evaluation}
    rows = []
    for panel, mask in panel_masks(screened, healthy_rule, exclude_format_failures).items():
        ids = sorted(screened.loc[mask, "question_id"], key=lambda i: split_value(seed, i))
        for role in ROLES:
            chosen = [i for i in ids if (split_value(seed, i) < calibration_share) == (role == "calibration")]
            rows += [{"question_id": i, "panel": panel, "role": role} for i in chosen[:caps[role]]]
    return pd.DataFrame(rows, columns=["question_id", "panel", "role"])


def panel_sizes(panels: pd.DataFrame) -> dict[tuple[str, str], int]:
    """Questions per (panel, role), zeros included."""
    counts = panels.groupby(["panel", "role"]).size().to_dict() if len(panels) else {}
    return {(p, r): int(counts.get((p, r), 0)) for p in PANELS for r in ROLES}


class PanelTooSmall(UserError, ValueError):
    """A panel has fewer questions than the study needs; raised before any intervention runs."""


def check_panels(panels: pd.DataFrame, minimum: int, eligible: dict[str, int] | None = None) -> None:
    """Raise ``PanelTooSmall`` naming every (panel, role) with fewer than ``minimum`` questions."""
    small = [(p, r, n) for (p, r), n in panel_sizes(panels).items() if n < minimum]
    if small:
        found = "; ".join(f"{p} {r}: {n}" for p, r, n in small)
        pools = f" (eligible: {eligible})" if eligible else ""
        raise PanelTooSmall(f"panels too small for the study: {found} question(s), need >= {minimum} each{pools}. "
                            "Screen more questions (--n), move --calibration-share, choose another --healthy-rule "
                            "or task, or lower --min-panel.")
