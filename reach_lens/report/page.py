"""The data of one report page, from what ``collect`` found: protocols, the summary's tables and figures, the cells
with their questions, every probe's rows (``studies``), pass@k and the guessing floor per budget.

    data = page_data(collect("runs/sampling_gap/summary-table2-0123abcd4567"))
    data["probes"][0]["rows"][0]      # one question of the first probe (layout: reach_lens.report.rows)
"""
from __future__ import annotations

import base64
from collections.abc import Sequence

from reach_lens.protocol import canonical_json
from reach_lens.report.collect import Run, Store
from reach_lens.report.rows import CANDIDATE_FIELDS, QUESTION_FIELDS, cell_questions, number, plain, questions_frames
from reach_lens.report.studies import (QuestionIndex, greedy_probe, records_probe, rlvr_comparison, screen_probe,
                                       search_probes)
from reach_lens.stats import guessing_floor, pass_at_k

# the fields that name a probe within a cell: the rest (model, weights, task, questions, fmt, ...) make the cell
PROBE_FIELDS = ("probe", "K", "temperature", "top_p", "settings", "commit", "version", "libraries")
# the main table of each study's summary, the first one shown
MAIN_TABLES = ("table.csv", "table2.csv", "table1_geometric.csv", "table1_uniform.csv", "recovery_medians.csv",
               "table5.csv", "census.csv", "evaluation.csv")
# what differs between the runs of one RLVR audit: the probe, the checkpoint, and the control run's format
CHECKPOINT_FIELDS = (*PROBE_FIELDS, "model", "weights", "fmt", "prompt", "max_new_tokens", "stop_strings")
MAX_TABLE_ROWS = 300  # a longer summary table is named with its size, not inlined (it is in the directory)
MAX_FIGURE_BYTES = 8_000_000  # figures inlined in all; the others are named


def cell_key(store: Store) -> str:
    d = store.protocol.to_dict()
    return canonical_json({k: v for k, v in d.items() if k not in PROBE_FIELDS})


def _tables(run: Run) -> list[dict]:
    def rank(name: str) -> tuple:
        base = name.rsplit("/", 1)[-1]
        return (MAIN_TABLES.index(base) if base in MAIN_TABLES else len(MAIN_TABLES), name)

    out = []
    for name in sorted(run.tables, key=rank):
        df = run.tables[name]
        rows = None if len(df) > MAX_TABLE_ROWS else [[plain(v) for v in r] for r in df.itertuples(index=False)]
        out.append({"name": name, "columns": [str(c) for c in df.columns], "rows": rows, "n": len(df)})
    return out


def _figures(run: Run) -> list[dict]:
    out, total = [], 0
    for name, data in run.figures.items():
        total += len(data)
        src = "data:image/png;base64," + base64.b64encode(data).decode() if total <= MAX_FIGURE_BYTES else None
        out.append({"name": name, "src": src})
    return out


def _probes_of(c: int, i: int, store: Store, cell_stores: Sequence[Store], index: QuestionIndex) -> list[dict]:
    if "records" in store.tables:
        return [records_probe(c, i, store, index)]
    if "searches" in store.tables:
        return search_probes(c, i, store, index)
    screens = [t for t in store.tables if t.startswith("screen")]
    if screens:
        return [screen_probe(c, i, store, t, index) for t in sorted(screens)]
    if "deployed" in store.tables and not any("records" in s.tables for s in cell_stores):
        return [greedy_probe(c, i, store, index)]
    return []


def _questions_table(run: Run):
    names = [n for n in run.tables if n.rsplit("/", 1)[-1] == "questions.csv"]
    return run.tables[names[0]] if len(names) == 1 else None


def page_data(run: Run) -> dict:
    """Everything the page shows, as plain JSON (module docstring)."""
    groups: dict[str, list[int]] = {}
    for i, store in enumerate(run.stores):
        groups.setdefault(cell_key(store), []).append(i)
    cells, probes, indexes = [], [], []
    for c, members in enumerate(groups.values()):
        stores = [run.stores[i] for i in members]
        frames = questions_frames(stores)
        index = QuestionIndex([q for f in frames if len(f) for q in f["question_id"]])
        for i in members:
            probes += _probes_of(c, i, run.stores[i], stores, index)
        questions, prefix = cell_questions(frames, index.ids)
        p = stores[0].protocol
        cells.append({"label": f"{p.model} / {p.task} ({p.fmt})", "stores": members, "questions": questions,
                      "prefix": prefix})
        indexes.append(index)
    distinguish(cells, run.stores)
    compares = _rlvr(run, groups, cells, probes, indexes)
    budgets = sorted({row["K"] for p in probes for row in p["rows"] if row["K"]} |
                     {x[4] for cmp in compares for rows in cmp["rows"].values() for x in rows})
    options = sorted({len(q[QUESTION_FIELDS.index("options")] or []) for cell in cells for q in cell["questions"]}
                     - {0, 1})
    top = max(budgets, default=1)
    tables = _tables(run)
    return {
        "title": f"{run.stores[0].protocol.study}: {run.path.name}",
        "source": str(run.path), "kind": run.kind, "missing": run.missing, "text": run.text,
        "stores": [{"path": str(s.root.relative_to(run.path)) if s.root.is_relative_to(run.path) else str(s.root),
                    "protocol": s.protocol.to_dict(), "tables": list(s.tables)} for s in run.stores],
        "tables": tables, "figures": _figures(run), "cells": cells, "probes": probes, "compares": compares,
        "default": default_probe(probes, run.stores, tables),
        "question_fields": list(QUESTION_FIELDS), "candidate_fields": list(CANDIDATE_FIELDS),
        "passk": {str(K): [[number(pass_at_k(K, c, k)) for k in range(1, K + 1)] for c in range(K + 1)]
                  for K in budgets},
        "floors": {str(m): [number(v) for v in guessing_floor(m, list(range(1, top + 1)))] for m in options},
    }


def distinguish(cells: list[dict], stores: Sequence[Store]) -> None:
    """Cells that read alike (one model name and task, e.g. a pruned copy) get what tells their protocols apart:
    "weights=5004a8dc, settings.sparsity=0.5"."""
    alike: dict[str, list[dict]] = {}
    for cell in cells:
        alike.setdefault(cell["label"], []).append(cell)
    for group in (g for g in alike.values() if len(g) > 1):
        flat = [_flat(stores[cell["stores"][0]].protocol.to_dict()) for cell in group]
        differ = [k for k in flat[0] if k != "commit" and len({canonical_json(f.get(k)) for f in flat}) > 1]
        for cell, f in zip(group, flat):
            cell["label"] += " [" + ", ".join(f"{k}={str(f.get(k))[:12]}" for k in differ) + "]"


def _flat(d: dict) -> dict:
    """A protocol dict with its settings' keys as "settings.<key>"."""
    return {**{k: v for k, v in d.items() if k != "settings"}, **{f"settings.{k}": v for k, v in d["settings"].items()}}


def default_probe(probes: Sequence[dict], stores: Sequence[Store], tables: Sequence[dict]) -> int:
    """The probe shown first: the first one sampled at the temperature of the main table's first row (a study's
    main temperature), else the first."""
    main = tables[0] if tables and tables[0]["rows"] else None
    if main and "T" in main["columns"]:
        T = main["rows"][0][main["columns"].index("T")]
        for i, p in enumerate(probes):
            if p["kind"] == "samples" and stores[p["store"]].protocol.temperature == T:
                return i
    return 0


def _rlvr(run: Run, groups: dict[str, list[int]], cells: list[dict], probes: list[dict],
          indexes: list[QuestionIndex]) -> list[dict]:
    """The side-by-side comparisons of an RLVR audit: the cells that differ only in the checkpoint (their labels
    get the checkpoint's, where the summary's questions.csv names it)."""
    cell_of = {i: c for c, members in enumerate(groups.values()) for i in members}
    audits: dict[str, list] = {}
    formats: dict[tuple[str, str], int] = {}
    for i, store in enumerate(run.stores):
        p = store.protocol
        if p.study != "rlvr_compare":
            continue
        same = canonical_json({k: v for k, v in p.to_dict().items() if k not in CHECKPOINT_FIELDS})
        if "records" in store.tables:
            probe = next(pr for pr in probes if pr["store"] == i)
            audits.setdefault(same, []).append((cell_of[i], store, probe, indexes[cell_of[i]]))
        elif "deployed" in store.tables and p.fmt == p.settings.get("control_fmt"):
            formats[(same, p.weights)] = i
    out = []
    for same, members in audits.items():
        controls = {cell: run.stores[formats[(same, store.protocol.weights)]]
                    for cell, store, _, _ in members if (same, store.protocol.weights) in formats}
        compare = rlvr_comparison(members, controls, _questions_table(run))
        for cell, label in zip(compare["cells"], compare["labels"]):
            if label is not None:
                cells[cell]["label"] = f"{label}: {cells[cell]['label']}"
        out.append(compare)
    return out

