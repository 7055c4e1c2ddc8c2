"""The probes of each study's stores, with what each study adds to a question (``rows`` holds the row layout).

- sampling gap and selection: each ``records`` table is a probe; selection adds what every answer-blind selector
  picked (``select.SELECTORS``) and the learned router's route;
- routing: each (action space, method) search of the ``searches`` table is a probe over its routes, every candidate
  noted with its route's edits against the full path ("skip 7, repeat 12");
- MLP localization and census: a ``screen`` table is a probe of greedy answers beside recognition; localization
  adds each panel question's answer under every stored condition, repaired / broken / unchanged against its clean
  answer;
- RLVR: each checkpoint's records cut to the study's K (``rlvr.audit_run.records_at``), and the checkpoints side by
  side per question with their fates (the summary's questions.csv names which checkpoint is which).
"""
from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence

import pandas as pd

from reach_lens.report.rows import GREEDY_FILTERS, RECORD_FILTERS, greedy_row, plain, record_row
from reach_lens.rlvr.audit_run import records_at
from reach_lens.rlvr.fates import REACHABILITY_FATES, REALIZATION_FATES
from reach_lens.select import SELECTORS, majority_vote
from reach_lens.records import make_record

SCREEN_FILTERS = (("generated", "generated"), ("recognized", "recognized"),
                  ("recognized_not_generated", "recognized, not generated"),
                  ("recognized_and_generated", "recognized and generated"),
                  ("greedy_format_failure", "greedy format failure"))
PANEL_FILTERS = (("panel:failure", "failure set"), ("panel:healthy", "healthy panel"),
                 ("role:calibration", "calibration"), ("role:evaluation", "evaluation"))
FATE_FILTERS = tuple((f"fate:{f}", f.replace("_", " ")) for f in (*REALIZATION_FATES, *REACHABILITY_FATES))


class QuestionIndex:
    """Question ids of one cell in first-seen order; ``of(id)`` gives (and if new, adds) its index."""

    def __init__(self, ids: Sequence[str] = ()):
        self.ids: list[str] = []
        self._at: dict[str, int] = {}
        for i in ids:
            self.of(i)

    def of(self, question_id: str) -> int:
        if question_id not in self._at:
            self._at[question_id] = len(self.ids)
            self.ids.append(question_id)
        return self._at[question_id]


def _ranges(layers: Sequence[int]) -> str:
    out, start = [], None
    for i, layer in enumerate(layers):
        if start is None:
            start = layer
        if i + 1 == len(layers) or layers[i + 1] != layer + 1:
            out.append(f"{start}" if start == layer else f"{start}-{layer}")
            start = None
    return ", ".join(out)


def route_edits(route: Sequence[int] | None, n_layers: int) -> str:
    """A route as its edits against the full path 0..n_layers-1 (None: the full path): "full path", "skip 7",
    "skip 3-4, repeat 12", "repeat 12 x3"; repeats of a route that runs out of layer order (a repeated segment) read
    "as a window"."""
    if route is None:
        return "full path"
    route = [int(layer) for layer in route]
    if route == list(range(n_layers)):
        return "full path"
    counts = Counter(route)
    skipped = [l for l in range(n_layers) if counts[l] == 0]
    parts = [f"skip {_ranges(skipped)}"] if skipped else []
    window = "" if route == sorted(route) else " as a window"
    for times in sorted({c for c in counts.values() if c > 1}):
        again = sorted(l for l, c in counts.items() if c == times)
        parts.append(f"repeat {_ranges(again)}{window}" + (f" x{times}" if times > 2 else ""))
    return ", ".join(parts) if parts else "full path, reordered"


def probe_label(protocol, K: int | None = None) -> str:
    """What a probe drew: "T=0.8, K=8", "routes (skip_repeat, geometric), K=32", "greedy (shared)", ..."""
    p, K = protocol, protocol.K if K is None else K
    if p.probe == "sample":
        nucleus = "" if p.top_p == 1 else f", top-p {p.top_p:g}"
        of = "" if K == p.K else f" of {p.K} samples"
        return f"T={p.temperature:g}{nucleus}, K={K}{of}"
    if p.probe == "route":
        s = p.settings
        what = ", ".join(str(s[k]) for k in ("space", "random_routes") if k in s)
        return f"routes ({what}), K={K}" if what else f"routes, K={K}"
    return f"greedy ({p.fmt})"


def intervention_text(d: Mapping) -> str:
    """One stored intervention dict in a few words: "silence L12 hook_mlp_out", "steer L12 alpha -4", ..."""
    words = [str(d.get("kind", "?"))]
    words += [f"L{d['layer']}"] if d.get("layer") is not None else []
    words += [f"alpha {d['alpha']:g}"] if d.get("alpha") is not None else []
    words += [f"{len(d['units'])} units"] if d.get("units") else []
    words += [str(d["site"])] if d.get("site") else []
    return " ".join(words)


def _probe(cell: int, store: int, label: str, kind: str, K: int, filters, rows: list) -> dict:
    return {"cell": cell, "store": store, "label": label, "kind": kind, "K": K,
            "filters": [list(f) for f in filters], "rows": rows}


def records_probe(cell: int, store_i: int, store, index: QuestionIndex) -> dict:
    """The probe of a ``records`` table; selection adds each selector's pick and the learned router, RLVR cuts the
    records to the study's K, route candidates are noted with their edits."""
    p, study = store.protocol, store.protocol.study
    records = store.read("records")
    # a route probe's first candidate is the full path (random_route_candidates): the model's layer count
    n_layers = len(records.iloc[0]["candidates"][0]["route"] or ()) if p.probe == "route" and len(records) else None
    K = int(p.settings.get("K", p.K)) if study == "rlvr_compare" else p.K
    if K != p.K:
        records = records_at(records, K)
    router = store.read("router").set_index("question_id") if "router" in store.tables else None
    note = (lambda c: route_edits(c["route"], n_layers)) if p.probe == "route" and n_layers else (lambda c: None)
    rows, filters = [], list(RECORD_FILTERS)
    if study == "selection":
        filters += [(f"pick:{name}", f"{name} picks a correct one") for name in SELECTORS]
    for record in records.to_dict("records"):
        row, group_of = record_row(index.of(record["question_id"]), record, note)
        if study == "selection":
            picks = []
            for name, select in SELECTORS.items():
                try:
                    i = select(list(record["candidates"]))
                except ValueError:  # a channel the stored candidates do not carry (entropy, hidden): no pick
                    picks.append([name, None, None])
                    continue
                right = bool(record["candidates"][i]["correct"])
                picks.append([name, group_of[i], int(right)])
                row["t"] += [f"pick:{name}"] if right else []
            row["x"] = {"picks": picks}
        if router is not None and record["question_id"] in router.index:
            r = router.loc[record["question_id"]]
            row.setdefault("x", {})["router"] = [route_edits(r["route"], n_layers) if n_layers else str(r["route"]),
                                                 plain(r["answer"]), int(bool(r["correct"]))]
        rows.append(row)
    return _probe(cell, store_i, probe_label(p, K), "routes" if p.probe == "route" else "samples", K, filters, rows)


def greedy_probe(cell: int, store_i: int, store, index: QuestionIndex) -> dict:
    """The probe of a ``deployed`` table alone (a control format's greedy answers)."""
    rows = [greedy_row(index.of(r["question_id"]), r) for r in store.read("deployed").to_dict("records")]
    return _probe(cell, store_i, probe_label(store.protocol), "greedy", 0, GREEDY_FILTERS, rows)


def search_probes(cell: int, store_i: int, store, index: QuestionIndex) -> list[dict]:
    """One probe per (action space, method) search of a ``searches`` table: its routes' candidates in search order,
    the full path's as the deployed answer (a record is built per search only to count them: its gold is not read),
    each question tagged with the searches of its space that reach it."""
    searches = store.read("searches")
    if not len(searches):
        return []
    router = store.read("router").set_index("question_id") if "router" in store.tables else None
    n_layers = len(searches.iloc[0]["searches"][0]["routes"][0])  # every search starts with the full path
    full = tuple(range(n_layers))
    traced: dict[tuple[str, str], list[dict]] = {}
    reached: dict[tuple[str, str, str], bool] = {}  # (question id, space, method) -> some route correct
    for s in searches.to_dict("records"):
        by_route = {tuple(int(l) for l in c["route"]): c for c in s["candidates"]}
        dep = by_route[full]
        for t in s["searches"]:
            cands = [by_route[tuple(int(l) for l in r)] for r in t["routes"]]
            record = make_record(s["question_id"], "", {k: dep[k] for k in ("text", "answer", "correct")}, cands,
                                 majority_vote(cands))
            row, _ = record_row(index.of(s["question_id"]), record, lambda c: route_edits(c["route"], n_layers))
            hit = next((k for k, c in enumerate(cands) if c["correct"]), None)
            row["x"] = {"first": None if hit is None else hit + 1}
            if router is not None and s["question_id"] in router.index:
                r = router.loc[s["question_id"]]
                row["x"]["router"] = [route_edits(r["route"], n_layers), plain(r["answer"]), int(bool(r["correct"]))]
            traced.setdefault((t["space"], t["method"]), []).append(row)
            reached[(s["question_id"], t["space"], t["method"])] = bool(record["o"])
    probes = []
    for (space, method), rows in traced.items():
        methods = [m for (sp, m) in traced if sp == space]
        for row in rows:
            qid = index.ids[row["q"]]
            row["t"] += [f"by:{m}" for m in methods if reached[(qid, space, m)]]
        filters = [*RECORD_FILTERS, *((f"by:{m}", f"reached by {m}") for m in methods)]
        probes.append(_probe(cell, store_i, f"{space} / {method}, K={store.protocol.K}", "search", store.protocol.K,
                             filters, rows))
    return probes


def _effect(clean: bool, now: bool) -> str:
    return "repaired" if now and not clean else "broken" if clean and not now else "unchanged"


def screen_probe(cell: int, store_i: int, store, table: str, index: QuestionIndex) -> dict:
    """The probe of a ``screen`` table (recognition and greedy generation per question); a localization store adds
    its panels and every condition's answer per panel question."""
    screened = store.read(table)
    panels = store.read("panels") if table == "screen" else pd.DataFrame()
    conditions = store.read("conditions", key="row_key") if table == "screen" else pd.DataFrame()
    panel_of = {r["question_id"]: (r["panel"], r["role"]) for r in panels.to_dict("records")} if len(panels) else {}
    by_question: dict[str, list] = {}
    for c in conditions.to_dict("records") if len(conditions) else []:
        by_question.setdefault(c["question_id"], []).append(c)
    rows = []
    for r in screened.to_dict("records"):
        generated, recognized = bool(r["generated"]), r["recognized"]
        recognized = None if recognized is None or pd.isna(recognized) else bool(recognized)
        tags = ["generated"] if generated else []
        tags += ["recognized"] if recognized else []
        tags += ["recognized_not_generated"] if recognized and not generated else []
        tags += ["recognized_and_generated"] if recognized and generated else []
        tags += ["greedy_format_failure"] if not r["gen_format_ok"] else []
        row = {"q": index.of(r["question_id"]), "d": int(generated), "K": 0, "hits": 0, "o": int(generated), "ff": 0,
               "dep": [r["gen_text"], plain(r["gen_answer"]), int(generated)], "vote": None, "c": [], "t": tags,
               "x": {"rec": [plain(r["recog_pred"]), None if recognized is None else int(recognized)]}}
        if r["question_id"] in panel_of:
            panel, role = panel_of[r["question_id"]]
            row["t"] += [f"panel:{panel}", f"role:{role}"]
            row["x"]["cond"] = [[c["condition"], "; ".join(intervention_text(i) for i in json.loads(c["interventions"]))
                                 or "none", c["role"], plain(c["answer"]), int(bool(c["correct"])),
                                 _effect(generated, bool(c["correct"]))] for c in by_question.get(r["question_id"], [])]
        rows.append(row)
    filters = [*SCREEN_FILTERS, *(PANEL_FILTERS if panel_of else ())]
    label = "screen (the unedited model)" if table == "screen_base" else "screen"
    return _probe(cell, store_i, label, "screen", 0, filters, rows)


def _hits_at(records: pd.DataFrame) -> dict[str, tuple[int, int]]:
    return {r["question_id"]: (int(bool(r["d"])), int(r["hits"])) for r in records.to_dict("records")}


def checkpoint_labels(at_k: Mapping[int, pd.DataFrame], questions: pd.DataFrame | None) -> dict[int, str]:
    """Which checkpoint (a cell, by its records at K) is the base and which the trained one of each pair of the
    summary's per-question table (pair, question_id, d_base, hits_base, d_trained, hits_trained): the checkpoint
    whose greedy verdicts and hit counts are those columns. Cells no column describes keep no label."""
    if questions is None or not {"pair", "question_id", "d_base", "hits_base", "d_trained", "hits_trained"} <= set(
            questions.columns):
        return {}
    vectors = {cell: _hits_at(r) for cell, r in at_k.items()}
    labels: dict[int, str] = {}

    def match(side: pd.DataFrame, d: str, hits: str, label: str) -> None:
        wanted = {q: (int(bool(a)), int(b)) for q, a, b in zip(side.question_id, side[d], side[hits])}
        for cell, have in vectors.items():
            if cell not in labels and have == wanted:
                labels[cell] = label
                return

    pairs = list(dict.fromkeys(questions.pair))
    match(questions[questions.pair == pairs[0]], "d_base", "hits_base", "base")
    for pair in pairs:
        match(questions[questions.pair == pair], "d_trained", "hits_trained", str(pair))
    return labels


def rlvr_comparison(members: Sequence[tuple[int, object, dict, QuestionIndex]], controls: Mapping[int, object],
                    questions: pd.DataFrame | None) -> dict:
    """The checkpoints of one RLVR audit side by side (``members``: (cell, records store, its probe, its question
    index)): per question id and checkpoint [d, hits at K, o at K, hits over all samples, samples, control-format
    verdict]; the fates of the summary's questions.csv per question, and as tags of the trained checkpoints' rows
    (``FATE_FILTERS``)."""
    records = {cell: store.read("records") for cell, store, _, _ in members}
    at_k = {cell: records_at(records[cell], probe["K"]) if probe["K"] != int(records[cell]["K"].iloc[0])
            else records[cell] for cell, _, probe, _ in members}
    labels = checkpoint_labels(at_k, questions)
    members = sorted(members, key=lambda m: labels.get(m[0]) != "base")  # the base first
    per_question: dict[str, list] = {}
    for cell, _, _, _ in members:
        control = controls.get(cell)
        verdicts = ({r["question_id"]: int(bool(r["correct"])) for r in control.read("deployed").to_dict("records")}
                    if control is not None else {})
        full = {r["question_id"]: (int(r["hits"]), int(r["K"])) for r in records[cell].to_dict("records")}
        for r in at_k[cell].to_dict("records"):
            q = r["question_id"]
            per_question.setdefault(q, []).append([int(bool(r["d"])), int(r["hits"]), int(bool(r["o"])), *full[q],
                                                   verdicts.get(q)])
    fates: dict[str, list] = {}
    tags: dict[tuple[str, str], list[str]] = {}
    if questions is not None and labels:
        for r in questions.to_dict("records"):
            fates.setdefault(r["question_id"], []).append([str(r["pair"]), r["realization"], r["reachability"]])
            tags[(str(r["pair"]), r["question_id"])] = [f"fate:{r['realization']}", f"fate:{r['reachability']}"]
    trained = {str(pair) for pair, _ in tags}
    for cell, _, probe, index in members:
        if labels.get(cell) in trained:
            probe["filters"] = [*probe["filters"], *(list(f) for f in FATE_FILTERS)]
            for row in probe["rows"]:
                row["t"] += tags.get((labels[cell], index.ids[row["q"]]), [])
    return {"cells": [cell for cell, _, _, _ in members], "labels": [labels.get(cell) for cell, _, _, _ in members],
            "K": members[0][2]["K"], "control_fmt": members[0][1].protocol.settings.get("control_fmt"),
            "rows": per_question, "fates": fates}
