"""Positive controls: a failure planted in one MLP block of the studied model, and the pool it is studied on.

The **pool**: questions the unedited model recognizes and generates correctly, and still answers correctly with
the MLP of the planted layer silenced. Silencing that block in the planted model then undoes the edit on every
pool question, so the planted failure has one known locus; what a control tests is whether the study finds it
among every layer and component (and, for the unit plant, whether steering and the top units find the edit).
The push goes towards the pool's least frequent gold letter (this model's correct answers are mostly its
favourite letter). Its strength: for the bias push, the smallest of 1, 2, 4, ... that makes at least half of
the pool questions whose gold is another letter answer wrongly; for the unit plant, the most selective of
4, 5.7, 8, 11.3, ... (failures among the trigger set's questions minus failures among the other susceptible
ones) among those failing at least half of the trigger set. Each strength's answers are stored, so a rerun
repeats nothing.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence

import pandas as pd
from transformer_lens import HookedTransformer

from reach_lens import probes
from reach_lens.hooks import LAYER_OUTPUTS
from reach_lens.interventions import Silence, Steer
from reach_lens.localize.activations import perturbed_last_activations
from reach_lens.localize.plants import UnitPlant, answer_push, plant_answer_failure, plant_unit_failure, trigger_units
from reach_lens.store import RunStore
from reach_lens.tasks import Question, Task

log = logging.getLogger(__name__)

PLANTS = ("bias", "units")
FLIP_SHARE = 0.5  # the planted push must make at least this share of the measured questions fail
MIN_POOL = 8
STRENGTHS = {"bias": [2.0 ** i for i in range(8)], "units": [2.0 ** (i / 2) for i in range(4, 15)]}  # 4 .. 128


def _selectivity(step: dict) -> float:
    return step["flip_measured"] - (step["flip_others"] or 0.0)


def _enough(kind: str, tried: list[dict]) -> bool:
    """Bias push: stop at the first strength that fails FLIP_SHARE of the measured. Unit plant: go on while the
    selectivity (measured minus other failures) may still grow: stop when every measured question fails, or when
    it fell twice in a row after FLIP_SHARE was reached."""
    last = tried[-1]
    if kind == "bias":
        return last["flip_measured"] >= FLIP_SHARE
    if last["flip_measured"] >= 1.0:
        return True
    reached = [i for i, t in enumerate(tried) if t["flip_measured"] >= FLIP_SHARE]
    return len(tried) - (reached[0] if reached else len(tried)) >= 3 and \
        _selectivity(tried[-1]) < _selectivity(tried[-2]) < _selectivity(tried[-3])


def _chosen(kind: str, tried: list[dict]) -> dict:
    """The strength used: the last one tried for the bias push; for the unit plant the most selective among those
    failing at least FLIP_SHARE of the measured (the smaller on ties), else the last one tried."""
    if kind == "bias":
        return tried[-1]
    eligible = [t for t in tried if t["flip_measured"] >= FLIP_SHARE] or tried[-1:]
    return max(eligible, key=lambda t: (round(_selectivity(t), 9), -t["strength"]))


def answered(questions: Sequence[Question], base_screen: pd.DataFrame) -> list[Question]:
    """The ``questions`` (in order) that ``base_screen`` (a `screen` table of the unedited model) finds recognized
    and generated correctly: the pool of a planted control, and the questions whose failures a pruned copy creates
    (recognition unmeasured, as ``recognize="generated"`` leaves it for questions not generated, counts as not)."""
    recognized = base_screen.recognized.map(lambda r: bool(r) if pd.notna(r) else False)
    both = set(base_screen.question_id[recognized & base_screen.generated.astype(bool)])
    return [q for q in questions if q.id in both]


def control_pool(model: HookedTransformer, task: Task, questions: Sequence[Question], base_screen: pd.DataFrame,
                 fmt: str, layer: int, store: RunStore, batch_size: int = 16) -> tuple[list[Question], int]:
    """The pool (module docstring) and how many questions the unedited model recognizes and generates."""
    correct = answered(questions, base_screen)
    done = store.read("without_block")
    todo = [q for q in correct if q.id not in set(done.get("question_id", []))]
    if todo:
        log.info(f"greedy answers of {len(todo)} correctly answered questions with MLP {layer} silenced")
        deployed = probes.deploy(model, task, todo, fmt, interventions=[Silence(layer, "hook_mlp_out")],
                                 batch_size=batch_size)
        store.append("without_block", [{"question_id": q.id, "correct": bool(d["correct"]), "answer": d["answer"]}
                                       for q, d in zip(todo, deployed)])
        done = store.read("without_block")
    survives = set(done.question_id[done.correct.astype(bool)]) if len(done) else set()
    pool = [q for q in correct if q.id in survives]
    log.info(f"pool: {len(pool)} of {len(correct)} correctly answered questions survive silencing MLP {layer}")
    if len(pool) < MIN_POOL:
        raise ValueError(f"only {len(pool)} questions are recognized and generated by the unedited model, also without "
                         f"MLP {layer} (need >= {MIN_POOL}): raise --n")
    return pool, len(correct)


def plant_control(kind: str, model: HookedTransformer, task: Task, pool: Sequence[Question], fmt: str, layer: int,
                  store: RunStore, units_k: int = 8, share: float = 0.3, strength: float | None = None,
                  robust_layers: int = 4, batch_size: int = 16) -> tuple[HookedTransformer, dict]:
    """The planted model and what was planted (``info``: kind, layer, target, strength, flip shares, units...).

    The unit plant's units are chosen to keep firing when any one attention or MLP block of the ``robust_layers``
    layers before it is silenced (``trigger_units(perturbed=...)``): a trigger that one upstream block computes
    alone makes that block a second locus of the planted failure (seen on the embedded model: silencing
    attention 11 undid a layer-12 plant on 8 of 9 failures)."""
    if kind not in PLANTS:
        raise ValueError(f"plant {kind!r} unknown; expected one of {PLANTS}")
    target = pd.Series([q.gold for q in pool]).value_counts(ascending=True).index[0]
    token = model.tokenizer.convert_tokens_to_ids
    labels = sorted({label for q in pool for label in q.labels})
    push = answer_push(model, token(target), [token(label) for label in labels if label != target])
    susceptible = [q for q in pool if q.gold != target]
    info: dict = {"kind": kind, "planted_layer": layer, "target": target, "pool": len(pool),
                  "susceptible": len(susceptible)}
    if kind == "units":
        prompts = [task.prompt(q, fmt, model.tokenizer) for q in pool]
        upstream = [Silence(l, site) for l in range(max(0, layer - robust_layers), layer) for site in LAYER_OUTPUTS]
        log.info(f"activations of MLP {layer}'s units with each of {len(upstream)} upstream components silenced")
        acts, perturbed = perturbed_last_activations(model, prompts, layer, upstream, batch_size)
        trigger = trigger_units(acts, units_k, share, perturbed)
        triggered = {q.id for q, t in zip(pool, trigger["triggered"].tolist()) if t}
        measured = [q for q in susceptible if q.id in triggered]
        info.update(units=trigger["units"], seed_unit=trigger["seed"], weights=trigger["weights"].tolist(),
                    trigger_contrast=trigger["contrast"], triggered=len(triggered), measured=len(measured))

        def edit_at(s: float):
            return UnitPlant(layer, trigger["units"], trigger["weights"], push, s)
    else:
        measured = susceptible
        info.update(measured=len(measured))

        def edit_at(s: float):
            return Steer(layer, tuple(push.tolist()), s)
    if not measured:
        raise ValueError(f"no pool question can fail under a push towards {target!r} (all golds are {target!r}"
                         + (" or none triggers the units" if kind == "units" else "") + "): raise --n")
    done = store.read("plant_search", key="row_key")
    edit = "bias" if kind == "bias" else hashlib.sha256(repr(info["units"] + info["weights"]).encode()).hexdigest()[:12]
    measured_ids = {q.id for q in measured}
    others = [q.id for q in susceptible if q.id not in measured_ids]
    tried: list[dict] = []
    for s in [strength] if strength else STRENGTHS[kind]:  # the edit acts exactly as this intervention
        keys = [f"{edit}|{s:g}|{q.id}" for q in susceptible]
        if not set(keys) <= set(done.get("row_key", [])):
            deployed = probes.deploy(model, task, susceptible, fmt, interventions=[edit_at(s)],
                                     batch_size=batch_size)
            rows = [{"row_key": key, "strength": s, "question_id": q.id, "correct": bool(d["correct"])}
                    for key, q, d in zip(keys, susceptible, deployed)]
            store.append("plant_search", rows)
            done = store.read("plant_search", key="row_key")
        wrong = ~done.set_index("row_key").loc[keys].set_index("question_id").correct.astype(bool)
        step = {"strength": s, "flip_measured": float(wrong.loc[list(measured_ids)].mean()),
                "flip_others": float(wrong.loc[others].mean()) if others else None}
        tried.append(step)
        log.info(f"planted strength {s:g}: {step['flip_measured']:.0%} of {len(measured)} measured questions answer wrongly"
            + (f", {step['flip_others']:.0%} of the {len(others)} other susceptible ones" if others else ""))
        if _enough(kind, tried):
            break
    info.update(_chosen(kind, tried), search=tried)
    if kind == "units":
        planted = plant_unit_failure(model, layer, trigger["units"], trigger["weights"], push, info["strength"])
    else:
        planted = plant_answer_failure(model, layer, push, info["strength"])
    return planted, info
