"""The selection study's figures (tables of `reach_lens.routing.analysis` and `audit.summarize`): answer-blind
recovery per selector, and the selection gap (oracle - majority vote) vs temperature per model x task cell."""
import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from reach_lens.plots.common import GUESSER, _finish, _n, _require, legend_outside


def plot_recovery(rec: pd.DataFrame, probes: Sequence[tuple[str, str]], path: Path | str | None = None,
                  title: str = "Answer-blind recovery") -> Figure:
    """Answer-blind recovery per selector: one dot per model x task cell and probe (colour: probe; shape: task;
    hollow: format collapse, left out of the median), the median over clean cells as a bar. ``probes`` are
    (probe value, legend label) pairs.

    Columns (`analysis.recovery_rows` rows with model, task, probe): probe, selector, recovery, collapsed, n, K.
    """
    _require(rec, ("probe", "selector", "recovery", "collapsed", "n", "K"), "recovery")
    channels = list(dict.fromkeys(rec.selector))
    cells = list(dict.fromkeys(rec.task if "model" not in rec or rec.model.nunique() == 1
                               else rec.model + " / " + rec.task)) if "task" in rec else [None]
    cell_of = (rec.task if "model" not in rec or rec.model.nunique() == 1 else rec.model + " / " + rec.task) \
        if "task" in rec else pd.Series([None] * len(rec), index=rec.index)
    markers = dict(zip(cells, "os^DvP*X"))
    colors = ("tab:blue", "tab:orange", "tab:green", "tab:purple")
    fig = Figure(figsize=(9, 3.8))
    ax = fig.add_subplot()
    for j, (probe, _) in enumerate(probes):
        color, dx = colors[j % len(colors)], (j - (len(probes) - 1) / 2) * 0.3
        r = rec[rec.probe == probe]
        for x, ch in enumerate(channels):
            g = r[(r.selector == ch) & np.isfinite(r.recovery.astype(float))]
            for cell, row in zip(cell_of[g.index], g.itertuples()):
                ax.plot([x + dx], [float(row.recovery)], marker=markers[cell], color=color, ls="none", alpha=0.8,
                        ms=5.5, mfc="none" if bool(row.collapsed) else color)
            clean = g.recovery.to_numpy(dtype=float)[~g.collapsed.astype(bool).to_numpy()]
            if len(clean):
                ax.plot([x + dx - 0.1, x + dx + 0.1], [np.median(clean)] * 2, color=color, lw=2.5)
    ax.axhline(0, color="black", lw=0.8)
    ax.axhline(1, color="gray", lw=0.8, ls=":")
    handles = [Line2D([], [], color=colors[j % len(colors)], lw=5, label=label)  # colour: probe (shape: task)
               for j, (_, label) in enumerate(probes)]
    handles += [Line2D([], [], ls="none", marker=markers[c], color="black", mfc="none", label=c) for c in cells
                if c is not None]
    handles.append(Line2D([], [], color="gray", lw=2.5, label="median over clean cells"))
    legend_outside(ax, handles=handles, fontsize=8)
    ax.set_xticks(range(len(channels)), [textwrap.fill(c.replace("_", " "), 14) for c in channels], fontsize=8)
    ax.set_ylabel("recovery (selector - greedy) / (oracle - greedy)")
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(f"{title}: per model x task cell (shapes) and probe (colours), median over clean cells (bars); "
                 f"n = {_n(rec.n)} per cell, K = {_n(rec.K)}\nhollow = format collapse (left out of the median); "
                 "cells with oracle = greedy have no recovery", fontsize=8)
    return _finish(fig, path)


def plot_selection_gap(sweep: pd.DataFrame, path: Path | str | None = None,
                       title: str = "Selection gap of temperature samples") -> Figure:
    """Oracle - majority vote vs temperature, one line with its paired-bootstrap band per model x task cell.

    Columns: model, task, T, n, K, selection_gap, selection_gap_lo, selection_gap_hi (rows of `audit.summarize`);
    with ``guess_O`` and ``guess_D`` (multiple choice), each cell's floor O_K - 1/m, the gap a uniform guesser's
    vote leaves, is a dotted line in its color.
    """
    _require(sweep, ("model", "task", "T", "n", "K", "selection_gap", "selection_gap_lo", "selection_gap_hi"),
             "selection gap")
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    for (model, task), g in sweep.groupby(["model", "task"], sort=False):
        g = g.sort_values("T")
        line, = ax.plot(g["T"], g.selection_gap, marker="o", ms=4, label=f"{model} / {task} (n={_n(g.n)})")
        ax.fill_between(g["T"], g.selection_gap_lo, g.selection_gap_hi, color=line.get_color(), alpha=0.12, lw=0)
        if "guess_O" in g.columns and np.isfinite(float(g["guess_O"].iloc[0])):
            floor = float(g["guess_O"].iloc[0]) - float(g["guess_D"].iloc[0])
            ax.axhline(floor, color=line.get_color(), ls=":", lw=1.2,
                       label=f"{GUESSER} on {task}: O_K - 1/m = {floor:.1%}")
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xlabel("sampling temperature T")
    ax.set_ylabel("O_K - majority vote@K (share of questions)")
    ax.grid(alpha=0.3)
    legend_outside(ax, fontsize=7)
    ax.set_title(f"{title}, K = {_n(sweep.K)} (95% paired bootstrap bands)", fontsize=9)
    return _finish(fig, path)
