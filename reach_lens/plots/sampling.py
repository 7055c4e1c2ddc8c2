"""The sampling study's figures: reach@k vs k (`audit.reach_curve`), deployed D, vote@K, oracle O_K and the selection
gap vs temperature (rows of `audit.summarize`), the sampling-gap table (the paper's Table 2) as grouped bars, and
O_k - D over k per cell (`audit.gap_curve`)."""
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from reach_lens.plots.common import (GUESSER, _band, _bars, _finish, _guesser_curve, _n, _require, data_top,
                                     legend_outside)


def plot_reach_curve(curve_df: pd.DataFrame, path: Path | str | None = None, title: str = "reach@k",
                     deployed: float | None = None, vote: float | None = None) -> Figure:
    """reach@k vs k (log x) with its bootstrap band, from `audit.reach_curve` (k, reach, lo, hi, n, K).

    An optional `series` column draws one curve per series (e.g. random routes vs MCTS). `deployed` (D) is
    drawn as a horizontal line, `vote` (vote@K) as a marker at k = K. A `guess` column (multiple choice: the
    uniform guesser's 1 - (1 - 1/m)^k, `stats.guessing_floor`; NaN for free-form answers) is drawn as the floor.
    """
    _require(curve_df, ("k", "reach", "lo", "hi", "n", "K"), "reach curve")
    fig = Figure(figsize=(6, 4.2))
    ax = fig.add_subplot()
    groups = curve_df.groupby("series", sort=False) if "series" in curve_df.columns else [("oracle reach@k", curve_df)]
    for name, g in groups:
        line, = ax.plot(g["k"], g["reach"], marker="o", ms=3, label=str(name))
        ax.fill_between(g["k"], g["lo"], g["hi"], color=line.get_color(), alpha=0.2, lw=0)
    K = int(curve_df["K"].max())
    _guesser_curve(ax, curve_df)
    if deployed is not None:
        ax.axhline(deployed, color="black", ls="--", lw=1, label=f"deployed D = {deployed:.3f}")
    if vote is not None:
        ax.plot([K], [vote], marker="*", ms=12, color="tab:orange", ls="none", label=f"vote@{K} = {vote:.3f}")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("k (candidates)")
    ax.set_ylabel("share of questions correct")
    guess = curve_df["guess"] if "guess" in curve_df.columns else []
    ax.set_ylim(0, data_top(curve_df["hi"], guess, [deployed, vote]))
    ax.grid(alpha=0.3)
    legend_outside(ax, fontsize=8)
    ax.set_title(f"{title}\n(n = {_n(curve_df['n'])}, K = {_n(curve_df['K'])}; 95% bootstrap band)", fontsize=10)
    return _finish(fig, path)


def plot_temperature_gap(df: pd.DataFrame, path: Path | str | None = None,
                         title: str = "Selection gap vs temperature") -> Figure:
    """Left: deployed D, vote@K and oracle O_K vs T (Wilson bars, side by side); right: selection gap O_K - vote@K vs T (paired bootstrap band).

    Rows are `{"T": T, **audit.summarize(records)}`; with multiple choice, columns `guess_O` (the uniform
    guesser's O_K) and `guess_D` (its 1/m) draw the floors: O_K on the left, O_K - 1/m (the gap a guesser's
    vote leaves) on the right.
    """
    need = ("T", "n", "K", *(f"{m}{s}" for m in ("D", "vote", "O", "selection_gap") for s in ("", "_lo", "_hi")))
    _require(df, need, "temperature gap")
    df = df.sort_values("T")
    fig = Figure(figsize=(10, 4))
    ax1, ax2 = fig.subplots(1, 2)
    fig.subplots_adjust(wspace=0.32)  # room for the right panel's axis label
    K = int(df["K"].max())
    step = 0.012 * max(float(np.ptp(df["T"])), 0.5)  # three series' bars side by side, not blended bands
    _bars(ax1, df["T"] - step, df, "O", f"oracle O_{K}", "tab:green")
    _bars(ax1, df["T"], df, "vote", f"majority vote@{K}", "tab:orange", marker="s")
    _bars(ax1, df["T"] + step, df, "D", "deployed D (greedy)", "black", marker="D")
    ax1.set_ylabel("share of questions correct")
    ax1.set_ylim(0, data_top(df["O_hi"], df["vote_hi"], df["D_hi"], df["guess_O"] if "guess_O" in df else []))
    _band(ax2, df["T"], df, "selection_gap", f"O_{K} - vote@{K}", "tab:purple")
    if "guess_O" in df.columns and np.isfinite(float(df["guess_O"].iloc[0])):
        floor, per_option = float(df["guess_O"].iloc[0]), float(df["guess_D"].iloc[0])
        ax1.axhline(floor, color="gray", ls=":", lw=1.3, label=f"{GUESSER}'s O_{K} = {floor:.1%}")
        ax2.axhline(floor - per_option, color="gray", ls=":", lw=1.3,
                    label=f"{GUESSER}'s O_{K} - 1/m = {floor - per_option:.1%}")
    ax2.axhline(0, color="black", lw=0.8)
    ax2.set_ylabel("selection gap (share of questions)")
    for ax in (ax1, ax2):
        ax.set_xlabel("sampling temperature T")
        ax.grid(alpha=0.3)
        legend_outside(ax, "below", fontsize=8)
    fig.suptitle(f"{title} (n = {_n(df['n'])}, K = {_n(df['K'])}; 95% intervals)", fontsize=10)
    return _finish(fig, path)


def plot_gap_table(df: pd.DataFrame, path: Path | str | None = None) -> Figure:
    """The sampling-gap table (the paper's Table 2) as grouped bars per model x task cell: deployed D, vote@K and
    oracle O_K with their 95% intervals, and, for multiple choice, the uniform guesser's O_K (a black tick) that
    an oracle must be read against. Rows are `audit.gap_table_row` plus model, task, T (and guess_oracle)."""
    _require(df, ("model", "task", "n", "K", "T", *(f"{m}{s}" for m in ("deployed", "vote", "oracle")
                                                    for s in ("", "_lo", "_hi"))), "gap table")
    fig = Figure(figsize=(max(5.0, 1.9 * len(df) + 1.5), 4.2))
    ax = fig.add_subplot()
    series = (("deployed", "deployed D (greedy)", "black"), ("vote", "majority vote@K", "tab:orange"),
              ("oracle", "oracle O_K", "tab:green"))
    width = 0.26
    x = np.arange(len(df))
    for j, (key, label, color) in enumerate(series):
        y = df[key].to_numpy(dtype=float)
        err = np.vstack([y - df[f"{key}_lo"].to_numpy(dtype=float), df[f"{key}_hi"].to_numpy(dtype=float) - y])
        ax.bar(x + (j - 1) * width, y, width, yerr=err, capsize=3, color=color, alpha=0.8 if key != "deployed" else 0.6,
               label=label)
    if "guess_oracle" in df.columns:
        guess = df["guess_oracle"].to_numpy(dtype=float)
        for xi, g in zip(x, guess):
            if np.isfinite(g):
                ax.plot([xi + width / 2, xi + 1.5 * width], [g, g], color="black", lw=2)
        ax.plot([], [], color="black", lw=2, label="uniform guesser's O_K")
    ax.set_xticks(x, [f"{m}\n{t} (n={n})" for m, t, n in zip(df.model, df.task, df.n)], fontsize=8)
    ax.set_ylabel("share of questions correct")
    ax.set_ylim(0, 1.05)
    ax.grid(axis="y", alpha=0.3)
    legend_outside(ax, fontsize=8)
    temperatures = sorted({float(t) for t in df["T"]})
    ax.set_title(f"Deployed vs vote@K vs oracle@K (K = {_n(df['K'])}, T = {'/'.join(f'{t:g}' for t in temperatures)}; "
                 "95% intervals)", fontsize=10)
    return _finish(fig, path)


def plot_gap_curves(df: pd.DataFrame, path: Path | str | None = None, title: str = "O_k - D over k") -> Figure:
    """The sampling gap as a function of the budget, one curve per cell: O_k - D (reach@k minus the deployed
    share, `audit.gap_curve`) with its paired 95% bootstrap band, log k axis, zero marked. Columns: cell, k, gap,
    lo, hi, n, K; an optional ``guess_gap`` column (multiple choice: the uniform guesser's reach@k minus D; NaN
    for free-form cells) is drawn dotted in the cell's colour, the gap a blind guesser's oracle would show."""
    _require(df, ("cell", "k", "gap", "lo", "hi", "n", "K"), "gap curves")
    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.add_subplot()
    for cell, g in df.groupby("cell", sort=False):
        g = g.sort_values("k")
        line, = ax.plot(g["k"], g["gap"], marker="o", ms=2.5, label=str(cell))
        ax.fill_between(g["k"], g["lo"], g["hi"], color=line.get_color(), alpha=0.15, lw=0)
        if "guess_gap" in g.columns and np.isfinite(g["guess_gap"].to_numpy(dtype=float)).any():
            ax.plot(g["k"], g["guess_gap"], color=line.get_color(), ls=":", lw=1.3, label=f"{cell}: {GUESSER}")
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("k (samples)")
    ax.set_ylabel("O_k - D (share of questions)")
    ax.grid(alpha=0.3)
    legend_outside(ax, fontsize=8)
    ax.set_title(f"{title}\n(n = {_n(df['n'])}, K = {_n(df['K'])}; paired 95% bootstrap bands)", fontsize=10)
    return _finish(fig, path)
