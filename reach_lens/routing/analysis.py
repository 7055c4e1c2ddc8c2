"""What the routing and selection studies compute from their stored rows: oracle curves over k, random minus
structured search, the gains over the unmodified model (the paper's Table 1), and answer-blind recovery per cell
with format-collapse flags.

    pq = per_question(search_table, K, n_layers)           # one cell (model, task): arrays per question
    tables = analyse({("embedded", "arc_easy"): pq}, spaces, methods, K, vote_k=16, mcts_k=50)
    uniform = analyse(cells, spaces, methods, K, random_method="random_uniform")   # the other random law
    rec = recovery_rows(records, SELECTORS, collapse_threshold=0.5)   # one cell of the selection study

Every number from the search traces is an oracle (the reward is greedy correctness, known only with the gold
answer), except the random-route majority vote and the learned router.

Random searches are the methods whose name starts with "random": ``"random"`` draws geometric routes (a few edits
from the full path) and ``"random_uniform"`` uniform ones (``search_rows``' ``random_routes``); each analysis
compares one of them (``random_method``) with the structured searches.

Table 1's pooled row ("all questions pooled") is the mean over every question of the model's task columns
together. The paper's pool column is defined differently: its value exceeds every one of its task columns,
which no average of those columns can do, so the two are not comparable.

Format collapse: a cell whose candidates fail answer extraction more often than ``collapse_threshold`` is
flagged ``collapsed``; it stays in the tables and is left out of the clean counts and medians (the figures draw
it hollow). In the routing study the candidates are those of the structured searches of the space (each
distinct route once), so the flag does not depend on the law of the random routes it compares them with (a
law whose routes break the answer format is a finding, reported as ``random_format_failure_rate``, not a reason
to drop the cell); in the selection study, a probe's candidates.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from reach_lens.stats import format_p, paired_comparison, paired_direction, significance_words, wilson_band, wilson_interval
from reach_lens.select import majority_vote, recovery, recovery_table

GAINS_SPACE = "skip_repeat"
POOLED = "all questions pooled"
RANDOM = "random"


def is_random(method: str) -> bool:
    """Whether ``method`` names a random search (of any route law)."""
    return method == RANDOM or method.startswith(RANDOM + "_")

ROUTER = "learned_router"
ALPHA = 0.05  # the level of every paired test's verdict


# ---------------------------------------------------------------- routing


def per_question(searches: pd.DataFrame, K: int, n_layers: int, router: pd.DataFrame | None = None) -> dict:
    """Arrays of one cell from its ``searches`` table (`routing.search_rows`: question_id, searches, candidates)
    and, optionally, its learned router's table (`routing.router_rows`: question_id, correct).

    Keys: ``qids`` (sorted), ``D`` [n] (the full path's greedy correctness), ``oracle[(space, method)]`` [n, K]
    (max reward among the first k routes; a search that ended early keeps its last value), ``vote[(space, random
    method)]`` [n, K] (majority vote over the first k routes of that random search, correct or not),
    ``format_failures[space]`` (share of the structured searches' distinct route candidates without an extractable
    answer; the random routes' when no structured search ran), ``random_format_failures[(space, random method)]``
    (the same share over that random search's routes) and, with ``router``, ``router`` [n] (its route's greedy
    correctness).
    """
    rows = searches.set_index("question_id").sort_index()
    full = tuple(range(n_layers))
    out: dict = {"qids": list(rows.index), "oracle": {}, "vote": {}}
    by_route = [{tuple(c["route"]): c for c in cands} for cands in rows.candidates]
    out["D"] = np.array([float(c[full]["correct"]) for c in by_route])
    failures: dict[tuple[str, str], list[bool]] = {}
    structured: dict[str, list[bool]] = {}
    for i, traces in enumerate(rows.searches):
        seen: dict[str, set] = {}  # distinct routes of the structured searches, per space
        for t in traces:
            key = (t["space"], t["method"])
            o = out["oracle"].setdefault(key, np.zeros((len(rows), K)))
            acc = np.maximum.accumulate(np.asarray(t["rewards"], dtype=float))[:K]
            o[i] = np.concatenate([acc, np.full(K - len(acc), acc[-1])])
            if is_random(t["method"]):
                cands = [by_route[i][tuple(r)] for r in t["routes"]]
                failures.setdefault(key, []).extend(c["answer"] is None for c in cands)
                vote = out["vote"].setdefault(key, np.zeros((len(rows), K)))
                picks = [float(cands[majority_vote(cands[:k])]["correct"]) for k in range(1, len(cands) + 1)]
                vote[i] = picks + [picks[-1]] * (K - len(picks))
            else:
                routes = seen.setdefault(t["space"], set())
                for r in map(tuple, t["routes"]):
                    if r not in routes:
                        routes.add(r)
                        structured.setdefault(t["space"], []).append(by_route[i][r]["answer"] is None)
    out["random_format_failures"] = {key: float(np.mean(f)) for key, f in failures.items()}
    out["format_failures"] = {}
    for (space, _), f in failures.items():  # without a structured search, the random routes' own rate
        out["format_failures"][space] = float(np.mean(structured.get(space) or f))
    if router is not None:
        out["router"] = router.set_index("question_id").loc[out["qids"], "correct"].to_numpy(dtype=float)
    return out


def found_routes(searches: pd.DataFrame, space: str) -> dict[str, list[tuple[tuple[int, ...], float]]]:
    """(route, reward) pairs of every search in ``space`` per question of a ``searches`` table (router training data)."""
    return {row.question_id: [(tuple(r), float(w)) for s in row.searches if s["space"] == space
                              for r, w in zip(s["routes"], s["rewards"])] for row in searches.itertuples()}


def found_in(records: pd.DataFrame) -> dict[str, list[tuple[tuple[int, ...], float]]]:
    """(route, correct) pairs of every route candidate per question of a record table (router training data)."""
    return {qid: [(tuple(c["route"]), float(c["correct"])) for c in cands]
            for qid, cands in zip(records.question_id, records.candidates)}


def gains_space(spaces: Sequence[str]) -> str:
    """The action space of `gains_over_unmodified` (Table 1): Dr.LLM's skip/repeat when searched, else the first
    space."""
    return GAINS_SPACE if GAINS_SPACE in spaces else spaces[0]


def analyse(cells: Mapping[tuple[str, str], dict], spaces: Sequence[str], methods: Sequence[str], K: int,
            vote_k: int = 16, mcts_k: int = 50, collapse_threshold: float = 0.5,
            random_method: str = RANDOM) -> dict[str, pd.DataFrame]:
    """The routing study's tables from its cells (``cells[(model, task)] = per_question(...)``, with ``router``
    [n] added for Table 1), ``random_method``'s routes against the structured ``methods``: ``oracle_curves``,
    ``random_minus_structured``, ``direction_counts``, ``table1`` (`gains_over_unmodified`).

    Every share of questions (o(k), vote@k, D, O_K) carries its Wilson 95% interval (``lo``/``hi``, ``D_lo``/``D_hi``,
    ``random_oracle_lo``/...). O_random(K) - O_structured(K) on the same questions is `stats.paired_comparison`:
    Newcombe's paired 95% interval (``diff_lo``/``diff_hi``), the exact McNemar ``p`` and the discordant counts
    (``random_only``, ``structured_only``; ``both``, ``neither``)."""
    if not is_random(random_method):
        raise ValueError(f"random_method {random_method!r} is not a random search (expected 'random' or 'random_<law>')")
    structured = [m for m in methods if not is_random(m)]
    curves, diffs = [], []
    for (model, task), pq in cells.items():
        n = len(pq["qids"])
        d_lo, d_hi = wilson_interval(int(pq["D"].sum()), n)
        for space in spaces:
            rate = pq["format_failures"][space]
            flags = {"collapsed": rate > collapse_threshold, "format_failure_rate": rate,
                     "random_format_failure_rate": pq["random_format_failures"][(space, random_method)]}
            series = {**{m: pq["oracle"][(space, m)] for m in [random_method, *structured]},
                      "random vote": pq["vote"][(space, random_method)]}
            for name, values in series.items():
                mean, lo, hi = wilson_band(values)
                curves.append(pd.DataFrame({"model": model, "task": task, "space": space, "series": name,
                                            "k": np.arange(1, K + 1), "value": mean, "lo": lo, "hi": hi, "n": n,
                                            "K": K, "D": pq["D"].mean(), "D_lo": d_lo, "D_hi": d_hi, **flags}))
            random_k = pq["oracle"][(space, random_method)][:, -1]
            for method in structured:
                other_k = pq["oracle"][(space, method)][:, -1]
                test = paired_comparison(random_k.astype(bool), other_k.astype(bool))
                r_lo, r_hi = wilson_interval(int(random_k.sum()), n)
                s_lo, s_hi = wilson_interval(int(other_k.sum()), n)
                diffs.append({"model": model, "task": task, "space": space, "method": method, "n": n, "K": K,
                              "D": pq["D"].mean(), "D_lo": d_lo, "D_hi": d_hi,
                              "random_oracle": random_k.mean(), "random_oracle_lo": r_lo, "random_oracle_hi": r_hi,
                              "structured_oracle": other_k.mean(), "structured_oracle_lo": s_lo,
                              "structured_oracle_hi": s_hi,
                              "diff": test["diff"], "diff_lo": test["lo"], "diff_hi": test["hi"], "p": test["p"],
                              "random_only": test["a_only"], "structured_only": test["b_only"], "both": test["both"],
                              "neither": test["neither"], **flags})
    diffs_df = pd.DataFrame(diffs)
    return {"oracle_curves": pd.concat(curves, ignore_index=True), "random_minus_structured": diffs_df,
            "direction_counts": direction_counts(diffs_df),
            "table1": gains_over_unmodified(cells, gains_space(spaces), methods, K, vote_k, mcts_k, random_method)}


def _as_paired(row) -> dict:
    """A `random_minus_structured` row in `stats.paired_comparison`'s words (random is a, structured b)."""
    return {"p": row["p"], "a_only": row["random_only"], "b_only": row["structured_only"]}


def direction(row, alpha: float = ALPHA) -> str:
    """A cell's direction, from the exact McNemar test of O_random(K) vs O_structured(K) (``p``, ``random_only``,
    ``structured_only``; `stats.paired_direction`): ``"random_better"`` or ``"structured_better"`` only when
    p < ``alpha``, else ``"tie"`` (not significant, as every cell of a handful of questions is)."""
    return {"a": "random_better", "b": "structured_better", "tie": "tie"}[paired_direction(_as_paired(row), alpha)]


def direction_text(row, alpha: float = ALPHA) -> str:
    """A cell's direction in words (`stats.significance_words`): ``"random higher, significant at 0.05
    (p = 0.003)"``, ``"<method> higher, ..."`` or ``"not significant at 0.05 (p = 0.077)"``."""
    return significance_words(_as_paired(row), alpha, ("random", row["method"]))


def comparison_lines(diffs: pd.DataFrame, alpha: float = ALPHA) -> pd.DataFrame:
    """``random_minus_structured`` as printed: per cell, O_random(K) and O_structured(K), the difference in pp with
    its Newcombe 95% interval and the exact McNemar p beside it, the discordant counts and the verdict
    (`direction_text`)."""
    rows = [{"model": r.model, "task": r.task, "space": r.space, "method": r.method, "n": r.n,
             "random": f"{100 * r.random_oracle:.1f}", "structured": f"{100 * r.structured_oracle:.1f}",
             "random - structured, pp [95%]": f"{100 * r.diff:+.1f} [{100 * r.diff_lo:+.1f}, {100 * r.diff_hi:+.1f}]",
             "p": format_p(r.p), "random_only vs structured_only": f"{r.random_only} vs {r.structured_only}",
             "verdict": ("collapsed: " if r.collapsed else "") + direction_text(r._asdict(), alpha)}
            for r in diffs.itertuples()]
    return pd.DataFrame(rows)


def direction_counts(diffs: pd.DataFrame) -> pd.DataFrame:
    """Per (space, method): clean cells where random is better / tied / worse (``direction``: by the exact paired
    test at 0.05, not the sign of the mean), collapsed cells, median difference."""
    rows = []
    for (space, method), g in (diffs.groupby(["space", "method"]) if len(diffs) else []):
        clean = g[~g.collapsed.astype(bool)]
        ways = clean.apply(direction, axis=1) if len(clean) else pd.Series([], dtype=str)
        rows.append({"space": space, "method": method, "clean_cells": len(clean),
                     "random_better": int((ways == "random_better").sum()), "tie": int((ways == "tie").sum()),
                     "structured_better": int((ways == "structured_better").sum()),
                     "collapsed_cells": int(g.collapsed.sum()),
                     "median_diff_clean": float(clean["diff"].median()) if len(clean) else float("nan")})
    return pd.DataFrame(rows, columns=["space", "method", "clean_cells", "random_better", "tie", "structured_better",
                                       "collapsed_cells", "median_diff_clean"])


def gains_over_unmodified(cells: Mapping[tuple[str, str], dict], space: str, methods: Sequence[str], K: int,
                          vote_k: int, mcts_k: int, random_method: str = RANDOM) -> pd.DataFrame:
    """Percentage points over the unmodified model (the paper's Table 1), per (model, task) and over all of a
    model's questions pooled (task ``POOLED``): learned router, random vote@vote_k, MCTS oracle over its first mcts_k
    distinct routes (the paper's "MCTS oracle@50 simulations": a simulation here is one distinct route evaluated),
    random oracle@K (the random columns from ``random_method``'s routes)."""
    vote_k, mcts_k = min(vote_k, K), min(mcts_k, K)
    rows = []
    for model in dict.fromkeys(m for m, _ in cells):
        values = {task: {"D": pq["D"], "router": pq["router"], "vote": pq["vote"][(space, random_method)][:, vote_k - 1],
                         "random": pq["oracle"][(space, random_method)][:, -1],
                         "mcts": pq["oracle"][(space, "mcts")][:, mcts_k - 1] if "mcts" in methods else None}
                  for (m, task), pq in cells.items() if m == model}
        values[POOLED] = {key: None if any(v[key] is None for v in values.values())
                          else np.concatenate([v[key] for v in values.values()]) for key in next(iter(values.values()))}
        for task, v in values.items():
            D = v["D"]
            rows.append({"model": model, "task": task, "space": space, "n": len(D), "D": float(D.mean()),
                         "learned_router_pp": _pp(v["router"], D), f"random_vote@{vote_k}_pp": _pp(v["vote"], D),
                         f"mcts_oracle@{mcts_k}_routes_pp": _pp(v["mcts"], D), f"random_oracle@{K}_pp": _pp(v["random"], D)})
    return pd.DataFrame(rows)


def _pp(x: np.ndarray | None, D: np.ndarray) -> float:
    return float("nan") if x is None else 100.0 * float(np.mean(x - D))


# ---------------------------------------------------------------- selection


def format_failure_rate(records: pd.DataFrame) -> float:
    """Share of all candidates of a record table without an extractable answer."""
    return float(records["format_failures"].sum() / records["K"].sum())


def with_wilson(rec: pd.DataFrame) -> pd.DataFrame:
    """Recovery rows with the Wilson 95% interval of each share of n questions (greedy, oracle, selector_acc) in
    ``<column>_lo`` / ``<column>_hi`` right after it."""
    out = rec.copy()
    for column in ("greedy", "oracle", "selector_acc"):
        bounds = np.array([wilson_interval(int(round(v * n)), int(n)) for v, n in zip(out[column], out["n"])])
        at = out.columns.get_loc(column) + 1
        out.insert(at, f"{column}_lo", bounds[:, 0])
        out.insert(at + 1, f"{column}_hi", bounds[:, 1])
    return out


def recovery_rows(records: pd.DataFrame, selectors: Mapping, collapse_threshold: float = 0.5) -> pd.DataFrame:
    """`select.recovery_table` of one cell's records with Wilson intervals (`with_wilson`), the cell's
    ``format_failure_rate`` and ``collapsed`` (that rate above ``collapse_threshold``)."""
    rate = format_failure_rate(records)
    return with_wilson(recovery_table(records, selectors)).assign(format_failure_rate=rate,
                                                                   collapsed=rate > collapse_threshold)


def router_recovery_row(records: pd.DataFrame, router: pd.DataFrame, collapse_threshold: float = 0.5) -> dict:
    """The learned router's recovery row for one cell's route records, from its `routing.router_rows` table
    (``question_id``, ``correct``): its accuracy may exceed the oracle (its route need not be a candidate)."""
    correct = router.set_index("question_id").loc[records.question_id, "correct"].astype(float)
    greedy, oracle, acc = float(records.d.mean()), float(records.o.mean()), float(correct.mean())
    rate = format_failure_rate(records)
    return {"selector": ROUTER, "n": len(records), "K": int(records.K.iloc[0]), "greedy": greedy, "oracle": oracle,
            "selector_acc": acc, "recovery": recovery(acc, greedy, oracle), "format_failure_rate": rate,
            "collapsed": rate > collapse_threshold}


def cell_recovery(tables: Mapping[str, pd.DataFrame], router: pd.DataFrame | None, selectors: Mapping,
                  collapse_threshold: float = 0.5, route_probe: str = "routes") -> pd.DataFrame:
    """Recovery rows of one cell's probes (``tables[probe]`` = its records; column ``probe``), with the learned
    router's row (`router_recovery_row`) added to ``route_probe`` when ``router`` is given."""
    rows = [recovery_rows(records, selectors, collapse_threshold).assign(probe=probe) for probe, records in tables.items()]
    if router is not None:
        rows.append(with_wilson(pd.DataFrame([{**router_recovery_row(tables[route_probe], router, collapse_threshold),
                                               "probe": route_probe}])))
    return pd.concat(rows, ignore_index=True)


def recovery_summary(rec: pd.DataFrame) -> pd.DataFrame:
    """Per (probe, selector): median recovery over the clean cells where it is defined (oracle > greedy), and
    how many cells are clean-and-defined and collapsed."""
    rows = []
    for (probe, selector), g in rec.groupby(["probe", "selector"], sort=False):
        clean = g[~g.collapsed.astype(bool)].recovery.dropna()
        rows.append({"probe": probe, "selector": selector, "median": float(clean.median()) if len(clean) else np.nan,
                     "cells_defined": len(clean), "collapsed_cells": int(g.collapsed.astype(bool).sum())})
    return pd.DataFrame(rows)
