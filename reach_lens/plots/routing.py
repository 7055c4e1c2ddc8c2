"""The routing study's figures (tables of `reach_lens.routing.analysis`): oracle o(k) over routes per search method,
one panel per model x task cell, and random minus structured search per cell; each series' colour, label and marker."""
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from reach_lens.plots.common import _finish, _guesser_curve, _n, _require, data_top

SERIES_COLORS = {"random": "tab:blue", "random_uniform": "tab:cyan", "mcts": "tab:red", "hill_climb": "tab:green", "genetic": "tab:purple",
                 "random vote": "tab:orange"}
SERIES_LABELS = {"random": "random routes, geometric law", "random_uniform": "random routes, uniform law",
                 "mcts": "MCTS", "hill_climb": "hill climbing", "genetic": "genetic search",
                 "random vote": "majority vote over the random routes"}
SERIES_MARKERS = {"random": "o", "random_uniform": "o", "mcts": "s", "hill_climb": "^", "genetic": "D",
                  "random vote": "v"}
LABELLED_CELLS = 6  # random-minus-structured dots get their cell's name up to this many per method


def plot_oracle_curves(curves: pd.DataFrame, space: str, path: Path | str | None = None) -> Figure:
    """Oracle o(k) per search method and the random-route vote@k vs k (log x), one panel per model x task, in
    one action space, with the deployed D; each series has its own marker and a small sideways offset so equal
    values stay visible, and its Wilson 95% interval is drawn at k = K (the reported O_K). A format-collapsed
    cell says so in its title; free-form panels are scaled to their data.

    Columns (`analysis.analyse`'s ``oracle_curves``): model, task, space, series, k, value, lo, hi, n, K, D,
    collapsed, format_failure_rate; an optional ``guess`` column (multiple choice: the uniform guesser's
    1 - (1 - 1/m)^k; NaN for free-form) is drawn as each panel's floor.
    """
    _require(curves, ("model", "task", "space", "series", "k", "value", "lo", "hi", "n", "K", "D", "collapsed",
                      "format_failure_rate"), "oracle curves")
    c = curves[curves.space == space]
    if len(c) == 0:
        raise ValueError(f"oracle curves: no rows for action space {space!r} (has {sorted(set(curves.space))})")
    models, tasks = list(dict.fromkeys(c.model)), list(dict.fromkeys(c.task))
    fig = Figure(figsize=(4.2 * len(tasks), 3.6 * len(models)))
    axes = np.array(fig.subplots(len(models), len(tasks), squeeze=False))
    fig.subplots_adjust(hspace=0.5)  # room for two-line panel titles under the x labels of the row above
    for i, m in enumerate(models):
        for j, t in enumerate(tasks):
            ax, cell = axes[i, j], c[(c.model == m) & (c.task == t)]
            series = list(dict.fromkeys(cell.series))
            for s_index, (name, g) in enumerate(cell.groupby("series", sort=False)):
                color = SERIES_COLORS.get(name)
                x = g.k * 2 ** (0.07 * (s_index - (len(series) - 1) / 2))  # apart on the log axis
                line, = ax.plot(x, g.value, ls="--" if name == "random vote" else "-", color=color, lw=1.3,
                                marker=SERIES_MARKERS.get(name, "o"), ms=3.5, label=SERIES_LABELS.get(name, name))
                end = g[g.k == g.k.max()]
                ax.errorbar(x[end.index], end.value, yerr=[end.value - end.lo, end.hi - end.value], color=line.get_color(),
                            capsize=3, lw=1.2, ls="none")
            ax.axhline(cell.D.iloc[0], color="black", lw=0.9, ls=":", label="deployed D (the full path)")
            _guesser_curve(ax, cell)
            flag = f", format collapse ({cell.format_failure_rate.iloc[0]:.0%})" if cell.collapsed.iloc[0] else ""
            broken = (f"\nno answer from {cell.random_format_failure_rate.iloc[0]:.0%} of random routes"
                      if "random_format_failure_rate" in cell else "")
            ax.set_title(f"{m} / {t} (n={cell.n.iloc[0]}){flag}{broken}", fontsize=9)
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.set_ylim(0, data_top(cell.hi, cell["guess"] if "guess" in cell else []))
            ax.grid(alpha=0.3)
            if i == len(models) - 1:
                ax.set_xlabel("k (distinct routes)")
            if j == 0:
                ax.set_ylabel("share of questions with a correct route")
    handles = {}  # one legend with every panel's series: a floor drawn only on a multiple-choice panel included
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    axes[0, -1].legend(handles.values(), handles.keys(), fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                       borderaxespad=0.0)
    fig.suptitle(f"Oracle o(k) over routes, action space '{space}' (n = {_n(c.n)}, K = {_n(c.K)}; greedy; "
                 "bars at k = K: 95% Wilson)", fontsize=10, y=1.0 + 0.06 / len(models))  # above the panel titles
    return _finish(fig, path)


def plot_random_minus_structured(diffs: pd.DataFrame, counts: pd.DataFrame, path: Path | str | None = None,
                                 title: str = "random routes") -> Figure:
    """O_random(K) - O_structured(K) in pp, one dot per model x task cell (hollow: format collapse), one panel per
    action space, one column per structured method, with the clean cells' random better / tie / structured
    better counts above. Columns: `analysis.analyse`'s ``random_minus_structured`` and ``direction_counts``."""
    _require(diffs, ("space", "method", "diff", "collapsed", "n", "K"), "random minus structured")
    _require(counts, ("space", "method", "random_better", "tie", "structured_better"), "direction counts")
    spaces, methods = list(dict.fromkeys(diffs.space)), list(dict.fromkeys(diffs.method))
    fig = Figure(figsize=(3.6 * len(spaces), 3.6))
    axes = fig.subplots(1, len(spaces), squeeze=False, sharey=True)[0]
    rng = np.random.default_rng(0)
    for ax, space in zip(axes, spaces):
        d = diffs[diffs.space == space]
        for x, method in enumerate(methods):
            g, color = d[d.method == method], SERIES_COLORS.get(method)
            for xi, row in zip(x + rng.uniform(-0.2, 0.2, len(g)), g.itertuples()):
                if "diff_lo" in g.columns:
                    ax.plot([xi, xi], [100 * row.diff_lo, 100 * row.diff_hi], color=color, lw=1, alpha=0.6)
                ax.plot([xi], [100 * row.diff], marker="o", ms=6, color=color, mfc="none" if row.collapsed else color,
                        ls="none")
                if len(g) <= LABELLED_CELLS and "task" in g.columns:  # few cells: say which dot is which
                    name = row.task if "model" not in g.columns or g.model.nunique() == 1 else f"{row.model}/{row.task}"
                    ax.annotate(name, (xi, 100 * row.diff), xytext=(4, 0), textcoords="offset points", fontsize=6,
                                va="center")
            c = counts[(counts.space == space) & (counts.method == method)].iloc[0]
            ax.text(x, 1.02, f"{c.random_better} / {c.tie} / {c.structured_better}", ha="center",
                    transform=ax.get_xaxis_transform(), fontsize=7)
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xticks(range(len(methods)), methods, fontsize=8)
        ax.set_xlim(-0.6, len(methods) - 0.4)
        broken = (f"no answer from {d.random_format_failure_rate.mean():.0%} of random routes (mean)"
                  if "random_format_failure_rate" in d else "")
        ax.set_title(f"{space}\n{broken}\n" if broken else f"{space}\n", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("O_random(K) - O_structured(K), pp")
    fig.suptitle(f"{title[:1].upper() + title[1:]} minus structured search, one dot per model x task cell "
                 f"(n = {_n(diffs.n)} questions per "
                 f"cell, K = {_n(diffs.K)}; lines: paired 95% intervals)\nabove each method: clean cells where "
                 "random is better / tie / structured is better (better: the interval excludes 0); hollow = format "
                 "collapse", fontsize=8,
                 y=1.14 if "random_format_failure_rate" in diffs else 1.08)
    return _finish(fig, path)
