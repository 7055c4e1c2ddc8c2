"""The RLVR checkpoint study's figures (tables of `reach_lens.rlvr.tables`): fates of questions (Figure 6a), deployed
vs reachable change (6b), realization by base hit rate (7), the lineage table with its guessing floors, the training
curve, and reach@k of base vs trained with their crossovers and their difference with its band."""
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, MaxNLocator

from reach_lens.plots.common import GUESSER, _finish, _guesser_curve, _n, _require, data_top, legend_outside


def _protocol_note(df: pd.DataFrame) -> str:
    """'n = .., K = .., T = ..' from a table's n, K and T columns."""
    return f"n = {_n(df['n'])}, K = {_n(df['K'])}, T = {float(df['T'].iloc[0]):g}"


def plot_rlvr_fates(df: pd.DataFrame, path: Path | str | None = None,
                    title: str = "Fates of questions, base -> trained") -> Figure:
    """Figure 6a from `rlvr.tables.fates_table` rows (+ T): per pair, counts of gains from base-reachable and
    base-unreachable questions, losses (drawn below 0) and the net deployed change (left); entered and left the
    reachable set and their net (right). Beside a count's bar, its nulls with their 95% intervals: a
    ``<column>_expected`` column (with ``_lo``, ``_hi``) as a black tick left of the bar's centre (independence
    of gaining and base reachability; permutation interval), a ``<column>_expected_resampling`` column (with
    ``_lo``, ``_hi``) as a hollow purple diamond on a dashed bar right of it (the trained greedy answer one of the
    base's samples; Poisson-binomial interval). The legend, under each panel, names both."""
    need = ("pair", "n", "K", "T", "gains_from_reachable", "gains_from_unreachable", "losses", "net_deployed_change",
            "entered_reachable", "left_reachable", "net_reachable_change")
    _require(df, need, "rlvr fates")
    fig = Figure(figsize=(max(8.0, 2.6 * len(df) + 4), 4.4))
    ax1, ax2 = fig.subplots(1, 2)
    panels = ((ax1, [("gains_from_reachable", 1, "gained, base-reachable", "tab:green"),
                     ("gains_from_unreachable", 1, "gained, base-unreachable", "tab:olive"),
                     ("losses", -1, "lost (realized -> not)", "tab:red"),
                     ("net_deployed_change", 1, "net deployed change", "black")], "questions (realized)"),
              (ax2, [("entered_reachable", 1, "entered reachable set", "tab:blue"),
                     ("left_reachable", -1, "left reachable set", "tab:orange"),
                     ("net_reachable_change", 1, "net reachable change", "black")], "questions (reachable at K)"))
    fig.subplots_adjust(wspace=0.35)
    # a count's nulls beside its bar: (column suffix, x shift in bar widths, marker style, interval line, legend)
    nulls = (("expected", -0.25, dict(fmt="_", ms=14, mew=2, color="black"), "-",
              "null: gains ignore base reachability (independence; 95%)"),
             ("expected_resampling", 0.25, dict(fmt="D", ms=6, mew=1.5, mfc="none", color="tab:purple"), "--",
              "null: trained greedy = one base sample (resampling; 95%)"))
    x = np.arange(len(df))
    for ax, series, ylabel in panels:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        width = 0.8 / len(series)
        for j, (col, sign, label, color) in enumerate(series):
            y = sign * df[col].to_numpy(dtype=float)
            bars = ax.bar(x + (j - (len(series) - 1) / 2) * width, y, width, color=color, label=label)
            ax.bar_label(bars, labels=[f"{int(v):+d}" if col.startswith("net") else f"{int(abs(v))}" for v in y],
                         fontsize=7, padding=1)
            at = x + (j - (len(series) - 1) / 2) * width
            for null, shift, style, bar_ls, null_label in nulls:
                if f"{col}_{null}" not in df.columns:
                    continue
                e = sign * df[f"{col}_{null}"].to_numpy(dtype=float)
                lo, hi = (sign * df[f"{col}_{null}_{b}"].to_numpy(dtype=float) for b in ("lo", "hi"))
                drawn = ax.errorbar(at + shift * width, e, yerr=np.vstack([e - np.minimum(lo, hi),
                                                                         np.maximum(lo, hi) - e]),
                                    capsize=3, label=null_label, **style)
                drawn[2][0].set_linestyle(bar_ls)
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xticks(x, [f"{p}\n(n = {int(n)})" for p, n in zip(df["pair"], df["n"])], fontsize=8)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, axis="y")
        entries = dict(zip(*ax.get_legend_handles_labels()[::-1]))  # each null once, though beside several bars
        names = sorted(entries, key=lambda name: name.startswith("null:"))  # the bars, then the nulls
        ax.legend([entries[name] for name in names], names, fontsize=7, loc="upper center",
                  bbox_to_anchor=(0.5, -0.16))  # below: the bars reach the top
    fig.suptitle(f"{title} ({_protocol_note(df)})", fontsize=10)
    return _finish(fig, path)


def _against_floor(row) -> str:
    """'O_K 56.7% -> 32.3%', and against the guessing floor when there is one."""
    text = f"O_K {row['O_base']:.1%} -> {row['O_trained']:.1%}"
    if not np.isfinite(float(row["floor"])):
        return text + " (free-form)"
    below = [name for name, v in (("base", row["O_base"]), ("trained", row["O_trained"])) if v <= row["floor"]]
    return text + f"\n{GUESSER}: {row['floor']:.1%}" + (f"; {' and '.join(below)} at or below it" if below else "")


def plot_rlvr_changes(df: pd.DataFrame, path: Path | str | None = None,
                      title: str = "Deployed vs reachable change") -> Figure:
    """Figure 6b from `rlvr.tables.checkpoint_changes` rows (+ T): per pair, the change of deployed D and of the oracle O_K
    side by side, with Newcombe's paired 95% intervals (`stats.paired_comparison`), in percentage points; under each pair, its O_K before and
    after against the uniform guesser's floor (column ``floor``; multiple choice only: an oracle below its floor
    shows no reach beyond guessing)."""
    need = ("pair", "n", "K", "T", "O_base", "O_trained", "floor",
            *(f"{m}_change{s}" for m in ("D", "O") for s in ("", "_lo", "_hi")))
    _require(df, need, "rlvr changes")
    fig = Figure(figsize=(max(5.0, 1.8 * len(df) + 3), 4.2))
    ax = fig.add_subplot()
    x = np.arange(len(df))
    for j, (m, label, color) in enumerate((("D", "deployed D (greedy)", "tab:blue"),
                                           ("O", f"oracle O_K (K = {_n(df['K'])})", "tab:green"))):
        y = 100 * df[f"{m}_change"].to_numpy(dtype=float)
        err = 100 * np.vstack([df[f"{m}_change"] - df[f"{m}_change_lo"], df[f"{m}_change_hi"] - df[f"{m}_change"]])
        bars = ax.bar(x + (j - 0.5) * 0.38, y, 0.38, yerr=err, capsize=4, color=color, label=label)
        ax.bar_label(bars, labels=[f"{v:+.1f}" for v in y], fontsize=8, padding=2)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(x, [f"{p}\n(n = {int(n)})\n{_against_floor(r)}" for p, n, (_, r)
                      in zip(df["pair"], df["n"], df.iterrows())], fontsize=8)
    ax.set_ylabel("trained - base (percentage points)")
    ax.grid(alpha=0.3, axis="y")
    legend_outside(ax, fontsize=8)
    ax.set_title(f"{title}\n({_protocol_note(df)}; paired 95%, Newcombe)", fontsize=10)
    return _finish(fig, path)


CHECKPOINT_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink",
                     "tab:olive", "tab:cyan", "tab:gray")  # one per checkpoint (pair) of a figure, in table order


def _propensity_tick(row: pd.Series) -> str:
    """A propensity bin's tick: its label in hits of K, under it its hit rates (when the table has the edges)."""
    if "hits_lo" not in row.index or "hits_hi" not in row.index or pd.isna(row["hits_lo"]):
        return str(row.name)
    K, lo, hi = int(row["K"]), int(row["hits_lo"]), int(row["hits_hi"])
    if hi == 0:
        return f"{row.name}\n(unreachable)"
    rates = f"{100 * lo / K:.3g}%" if lo == hi else f"{100 * lo / K:.3g}-{100 * hi / K:.3g}%"
    return f"{row.name}\n{rates}"


def plot_rlvr_propensity(df: pd.DataFrame, path: Path | str | None = None,
                         title: str = "Realization after training by base hit rate") -> Figure:
    """Figure 7 from `rlvr.tables.propensity` rows (+ T): among questions the base does not realize, the share
    realized after training per base hit-rate bin, with Wilson 95% bars and each bin's n (an empty bin is marked
    "0" at the bottom, with no point); with ``expected_realized`` (and ``expected_lo``/``_hi``), right of each point
    the share independence of realization and hit rate would give (a tick, 95% permutation).

    One panel per K (the bins follow K: `rlvr.fates.hit_rate_bins`), each with its own bins on x (ticks: the bin in hits
    of K and, with hits_lo/hits_hi columns, its hit rates); one colour per checkpoint (pair) across all panels
    (`CHECKPOINT_COLORS`, in table order), one marker per K. A bin no question falls in (n = 0 for every pair) is
    left out and counted under the axis. The legend (colours: checkpoints; markers: K and its panel; the expected
    tick) sits right of the last panel, off the data."""
    need = ("pair", "K", "T", "bin", "n", "realization", "realization_lo", "realization_hi")
    _require(df, need, "rlvr propensity")
    pairs = list(dict.fromkeys(df["pair"]))
    colors = {p: CHECKPOINT_COLORS[i % len(CHECKPOINT_COLORS)] for i, p in enumerate(pairs)}
    Ks = sorted({int(k) for k in df["K"]})
    markers = {K: "os^Dv"[i % 5] for i, K in enumerate(Ks)}
    n_bin = df.groupby(["K", "bin"], sort=False)["n"].max()  # a bin's question count (the same for every pair)
    every_bin = {K: list(dict.fromkeys(df.loc[df["K"] == K, "bin"])) for K in Ks}
    bins = {K: [b for b in every_bin[K] if n_bin[K, b] > 0] or every_bin[K] for K in Ks}
    dropped = sum(len(every_bin[K]) - len(bins[K]) for K in Ks)
    shown_empty = any(n_bin[K, b] == 0 for K in Ks for b in bins[K])
    per_bin = max(0.8, 0.25 * len(pairs) + 0.4)  # inches per bin
    legend_w = 3.4
    width_in = max(6.5, sum(per_bin * len(b) + 1.0 for b in bins.values()) + legend_w)
    fig = Figure(figsize=(width_in, 4.9))
    axes = fig.subplots(1, len(Ks), sharey=True, squeeze=False,
                        gridspec_kw={"width_ratios": [len(bins[K]) for K in Ks]})[0]
    fig.subplots_adjust(left=0.8 / width_in, right=1 - legend_w / width_in, bottom=0.22, top=0.84, wspace=0.08)
    width = 0.8 / len(pairs)
    where = {1: [""], 2: [" (left panel)", " (right panel)"]}.get(len(Ks),
                                                                   [f" (panel {i + 1})" for i in range(len(Ks))])
    has_expected = "expected_realized" in df.columns
    for ax, K in zip(axes, Ks):
        d = df[df["K"] == K]
        for j, pair in enumerate(pairs):
            g = d[d["pair"] == pair].set_index("bin").reindex(bins[K])
            if g["n"].isna().all():
                continue
            color = colors[pair]
            x = np.arange(len(bins[K])) + (j - (len(pairs) - 1) / 2) * width
            y = g["realization"].to_numpy(dtype=float)
            err = np.vstack([y - g["realization_lo"].to_numpy(dtype=float),
                             g["realization_hi"].to_numpy(dtype=float) - y])
            ax.errorbar(x, y, yerr=err, marker=markers[K], ms=5, capsize=3, ls="none", color=color,
                        label=f"{pair}, K = {K}")
            if has_expected:  # realization independent of the base hit rate
                n_bin = g["n"].to_numpy(dtype=float)
                with np.errstate(invalid="ignore", divide="ignore"):
                    e, lo, hi = (g[c].to_numpy(dtype=float) / n_bin for c in ("expected_realized", "expected_lo",
                                                                              "expected_hi"))
                ax.errorbar(x + width / 4, e, yerr=np.vstack([e - lo, hi - e]), fmt="_", ms=9, mew=1.5, capsize=2,
                            color=color, alpha=0.6, label=f"{pair}, K = {K}, expected")
            for xi, hi, n in zip(x, g["realization_hi"].to_numpy(dtype=float), g["n"].to_numpy(dtype=float)):
                if np.isnan(n):
                    continue
                ax.annotate(f"{int(n)}", (xi, -0.05 if np.isnan(hi) else hi), textcoords="offset points",
                            xytext=(0, 0 if np.isnan(hi) else 3), ha="center",
                            va="center" if np.isnan(hi) else "bottom", fontsize=7, color=color)
        first = d.drop_duplicates("bin").set_index("bin").reindex(bins[K])
        ax.set_xticks(np.arange(len(bins[K])), [_propensity_tick(r) for _, r in first.iterrows()], fontsize=7)
        ax.set_xlim(-0.6, len(bins[K]) - 0.4)
        ax.set_ylim(-0.08, 1.05)
        ax.grid(alpha=0.3, axis="y")
        ax.set_title(f"hit rate over K = {K} samples", fontsize=9)
    axes[0].set_ylabel("share realized after training")
    fig.supxlabel("base hits of K (hit rate) of questions the base does not realize; numbers: questions in the bin"
                  + (" (0 at the bottom: an empty bin)" if shown_empty else "")
                  + (f"; {dropped} bins no question falls in are left out (the table keeps them)" if dropped else ""),
                  fontsize=8)
    handles = [Line2D([], [], color=colors[p], lw=6, label=p) for p in pairs]
    handles += [Line2D([], [], color="dimgray", marker=markers[K], ls="none", label=f"hit rate over K = {K}{w}")
                for K, w in zip(Ks, where)]
    if has_expected:
        handles.append(Line2D([], [], color="dimgray", marker="_", ms=9, mew=1.5, ls="none",
                              label="tick right of a point: its share if\nrealization ignored the hit rate (95%)"))
    axes[-1].legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.04, 1), borderaxespad=0,
                    title="colour: checkpoint; marker: K", title_fontsize=8)  # outside: points fill the axes
    fig.suptitle(f"{title}\n(n = {_n(df.groupby(['pair', 'K'])['n'].sum())} base-unrealized questions, "
                 f"T = {float(df['T'].iloc[0]):g}; Wilson 95%)", fontsize=10)
    return _finish(fig, path)


def plot_rlvr_lineage(df: pd.DataFrame, path: Path | str | None = None,
                      title: str = "Lineage: deployed, vote and oracle") -> Figure:
    """Table 7 as a figure, from `rlvr.tables.deployed_vote_oracle` rows (+ T): per checkpoint, deployed D, majority vote@K
    and oracle O_K (Wilson 95%), the oracle over all samples as a hollow marker, and the uniform guesser's
    floor at K and at all samples as dashed lines (an oracle at its floor says nothing about reach)."""
    need = ("checkpoint", "n", "K", "T", "floor", "samples", "floor_all",
            *(f"{m}{s}" for m in ("D", "vote", "O", "O_all") for s in ("", "_lo", "_hi")))
    _require(df, need, "rlvr lineage")
    fig = Figure(figsize=(max(6.0, 1.9 * len(df) + 3), 4.4))
    ax = fig.add_subplot()
    x = np.arange(len(df))
    K, total = int(df["K"].iloc[0]), int(df["samples"].iloc[0])
    arms = (("D", "deployed D", "tab:blue"), ("vote", f"majority vote@{K}", "tab:orange"),
            ("O", f"oracle O_{K}", "tab:green"))
    for j, (m, label, color) in enumerate(arms):
        y = df[m].to_numpy(dtype=float)
        err = np.vstack([y - df[f"{m}_lo"].to_numpy(dtype=float), df[f"{m}_hi"].to_numpy(dtype=float) - y])
        bars = ax.bar(x + (j - 1) * 0.27, y, 0.27, yerr=err, capsize=3, color=color, label=label)
        ax.bar_label(bars, labels=[f"{v:.0%}" for v in y], fontsize=7, padding=2)
    ax.errorbar(x + 0.42, df["O_all"], yerr=np.vstack([df["O_all"] - df["O_all_lo"], df["O_all_hi"] - df["O_all"]]),
                marker="o", mfc="none", ms=7, color="darkgreen", ls="none", capsize=2, label=f"oracle O_{total}")
    floors = ((float(df["floor"].iloc[0]), f"floor at K = {K}"), (float(df["floor_all"].iloc[0]), f"floor at K = {total}"))
    for (value, label), style in zip(floors, ("--", ":")):
        if np.isfinite(value):
            ax.axhline(value, color="gray", ls=style, lw=1, label=f"{GUESSER}'s {label}: {value:.1%}")
    ax.set_xticks(x, [f"{c}\n(n = {int(n)})" for c, n in zip(df["checkpoint"], df["n"])], fontsize=8)
    ax.set_ylabel("share of questions correct")
    ax.set_ylim(0, 1.1)
    ax.grid(alpha=0.3, axis="y")
    legend_outside(ax, fontsize=7)
    ax.set_title(f"{title}\n({_protocol_note(df)}; Wilson 95%)", fontsize=10)
    return _finish(fig, path)


def plot_rlvr_training(log: pd.DataFrame, path: Path | str | None = None, title: str = "Training curve") -> Figure:
    """A TRL log (``training_log.csv``: one row per logging step) against the optimizer step: the mean GRPO reward
    with its spread over the logged completions, or the SFT loss, plus a running mean over 5 logging steps."""
    _require(log, ("step",), "rlvr training")
    metric = "reward" if "reward" in log else "loss"
    g = log.dropna(subset=[metric]) if metric in log else log.iloc[:0]
    if len(g) == 0:
        raise ValueError(f"rlvr training: the log has no {metric!r} rows")
    fig = Figure(figsize=(6.5, 4.0))
    ax = fig.add_subplot()
    ax.plot(g["step"], g[metric], marker="o", ms=3, lw=0.8, color="tab:blue", label=f"{metric} per logging step")
    if metric == "reward" and "reward_std" in g:
        ax.fill_between(g["step"], (g["reward"] - g["reward_std"]).clip(lower=0),  # a reward lies in [0, 1]
                        (g["reward"] + g["reward_std"]).clip(upper=1), color="tab:blue", alpha=0.12, lw=0,
                        label="± std over the step's completions (within [0, 1])")
    ax.plot(g["step"], g[metric].rolling(5, min_periods=1).mean(), color="black", lw=1.6, label="running mean (5)")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("mean reward (task grader)" if metric == "reward" else "training loss")
    ax.grid(alpha=0.3)
    legend_outside(ax, fontsize=8)
    ax.set_title(f"{title}\n({int(g['step'].max())} steps)", fontsize=10)
    return _finish(fig, path)


def plot_rlvr_reach_curves(curves: pd.DataFrame, crossings: pd.DataFrame, differences: pd.DataFrame,
                           narrowing: pd.DataFrame, path: Path | str | None = None,
                           title: str = "reach@k, base vs trained") -> Figure:
    """reach@k of each lineage for k = 1..2K, every point the unbiased pass@k from all 2K samples: per (base,
    trained) pair two stacked panels on a log k axis (base 2), each with its legend right of it, off the data.

    Upper panel, from `rlvr.tables.reach_curves` (checkpoint, k, reach, lo, hi, n, K = 2K; + T optional) and
    `rlvr.tables.crossovers` (pair, base, K, k_cross, k_min_gap, min_gap, min_gap_lo, min_gap_hi, gap_K, gap_K_lo,
    gap_K_hi): the base's curve (black) and the trained one's (one colour per pair, `CHECKPOINT_COLORS`) with their
    95% question-bootstrap bands. The k where the base overtakes is a dashed red line; when the trained curve stays
    ahead up to 2K the title says "no crossover up to k = 2K" with the gap there and its paired 95% interval, and
    a dotted line marks the k of the smallest gap. A ``guess`` column (multiple choice: 1 - (1 - 1/m)^k; NaN for
    free-form) is drawn as the floor.
    Lower panel, from `rlvr.tables.reach_leads` (differences: pair, k, base_minus_trained with _lo/_hi, K, samples,
    n_boot, seed; narrowing: pair, k_peak, lead_peak, lead_last, narrowing with _lo/_hi, narrows): base − trained
    in pp with its pointwise paired 95% band, the peak of the trained lead as a dotted line and the narrowing test
    (its verdict computed, never read off) in the title. The figure's title names K and 2K.
    """
    _require(curves, ("checkpoint", "k", "reach", "lo", "hi", "n", "K"), "rlvr reach curves")
    _require(crossings, ("pair", "base", "K", "k_cross", "k_min_gap", "min_gap", "min_gap_lo", "min_gap_hi", "gap_K",
                         "gap_K_lo", "gap_K_hi"), "rlvr crossovers")
    _require(differences, ("pair", "k", "base_minus_trained", "base_minus_trained_lo", "base_minus_trained_hi", "K",
                           "samples", "n_boot", "seed"), "rlvr reach differences")
    _require(narrowing, ("pair", "k_peak", "lead_peak", "lead_last", "narrowing", "narrowing_lo", "narrowing_hi",
                         "narrows"), "rlvr narrowing")
    K, samples = int(differences["K"].iloc[0]), int(differences["samples"].iloc[0])
    if {int(v) for v in curves["K"]} | {int(v) for v in crossings["K"]} != {samples}:
        raise ValueError(f"rlvr reach curves: curves and crossovers over K = {sorted(set(curves['K']))} and "
                         f"{sorted(set(crossings['K']))} samples, the differences over 2K = {samples}")
    height = 5.0 * len(crossings) + 1.0
    fig = Figure(figsize=(9.0, height))
    axes = fig.subplots(2 * len(crossings), 1, squeeze=False,
                        gridspec_kw={"height_ratios": [1.1, 0.9] * len(crossings)})
    fig.subplots_adjust(right=0.64, hspace=0.6, top=1 - 1.1 / height, bottom=0.45 / height)
    leads = narrowing.set_index("pair")
    for i, (_, row) in enumerate(crossings.iterrows()):
        ax, diff_ax = axes[2 * i, 0], axes[2 * i + 1, 0]
        color = CHECKPOINT_COLORS[i % len(CHECKPOINT_COLORS)]
        tops = []
        for label, line_color, role in ((row["base"], "black", "base"), (row["pair"], color, "trained")):
            g = curves[curves["checkpoint"] == label].sort_values("k")
            if len(g) == 0:
                raise ValueError(f"rlvr reach curves: no curve for checkpoint {label!r} (has "
                                 f"{list(dict.fromkeys(curves['checkpoint']))})")
            ax.plot(g["k"], g["reach"], marker="o", ms=2, lw=1.3, color=line_color, label=f"{label} ({role})")
            ax.fill_between(g["k"], g["lo"], g["hi"], color=line_color, alpha=0.15, lw=0)
            tops.append(g["hi"])
        base_curve = curves[curves["checkpoint"] == row["base"]]
        _guesser_curve(ax, base_curve)
        tops.append(base_curve["guess"] if "guess" in base_curve else [])
        if pd.isna(row["k_cross"]):
            ax.axvline(row["k_min_gap"], color="gray", ls=":", lw=1.2,
                       label=f"smallest gap, k = {int(row['k_min_gap'])}:\n{100 * row['min_gap']:+.1f} pp "
                             f"[{100 * row['min_gap_lo']:+.1f}, {100 * row['min_gap_hi']:+.1f}]")
            head = (f"{row['pair']}: no crossover up to k = 2K = {samples}; gap at k = {samples}: "
                    f"{100 * row['gap_K']:+.1f} pp [{100 * row['gap_K_lo']:+.1f}, {100 * row['gap_K_hi']:+.1f}]")
        else:  # k_cross = 1: the trained curve is never ahead
            what = "base overtakes at" if row["k_cross"] > 1 else "base at or above it from"
            ax.axvline(row["k_cross"], color="tab:red", ls="--", lw=1.2, label=f"{what} k = {int(row['k_cross'])}")
            head = f"{row['pair']}: {what} k = {int(row['k_cross'])} (of 2K = {samples})"
        ax.set_ylim(0, data_top(*tops))
        ax.set_ylabel("reach@k")
        ax.set_title(head, fontsize=9)
        d = differences[differences["pair"] == row["pair"]].sort_values("k")
        if len(d) == 0 or row["pair"] not in leads.index:
            raise ValueError(f"rlvr reach curves: no base − trained difference or narrowing for {row['pair']!r}")
        lead = leads.loc[row["pair"]]
        diff_ax.plot(d["k"], 100 * d["base_minus_trained"], marker="o", ms=2, lw=1.3, color=color,
                     label=f"{row['base']} − {row['pair']}")
        diff_ax.fill_between(d["k"], 100 * d["base_minus_trained_lo"], 100 * d["base_minus_trained_hi"], color=color,
                             alpha=0.2, lw=0, label="paired 95% band")
        diff_ax.axhline(0, color="black", lw=0.8)
        diff_ax.axvline(lead["k_peak"], color="gray", ls=":", lw=1.2,
                        label=f"peak of the {row['pair']} lead,\nk = {int(lead['k_peak'])}")
        verdict = "narrows" if lead["narrows"] else "no narrowing shown"
        diff_ax.set_title(f"{row['pair']} lead at its peak (k = {int(lead['k_peak'])}, "
                          f"{100 * lead['lead_peak']:+.1f} pp) − at k = {samples} "
                          f"({100 * lead['lead_last']:+.1f} pp):\n"
                          f"{100 * lead['narrowing']:+.1f} pp [{100 * lead['narrowing_lo']:+.1f}, "
                          f"{100 * lead['narrowing_hi']:+.1f}], {verdict}", fontsize=9)
        diff_ax.set_ylabel("base − trained (pp)")
        for a in (ax, diff_ax):
            a.set_xscale("log", base=2)
            a.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            a.grid(alpha=0.3)
            legend_outside(a, fontsize=8)
    axes[-1, 0].set_xlabel(f"k (samples, of the 2K = {samples})")
    note = f", T = {float(curves['T'].iloc[0]):g}" if "T" in curves.columns else ""
    fig.suptitle(f"{title}, K = {K}: reach@k for k = 1..2K = {samples}\n(n = {_n(curves['n'])}{note}; unbiased pass@k "
                 f"from all {samples} samples of each question, 95% question-bootstrap bands;\nbase − trained: "
                 f"pointwise band from {int(differences['n_boot'].iloc[0])} paired question resamples, seed "
                 f"{int(differences['seed'].iloc[0])})", fontsize=10)
    return _finish(fig, path)
