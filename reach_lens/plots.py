"""One function per figure kind: each takes a DataFrame and a path, writes a PNG (Agg, 150 dpi), returns the path.

The tables are those audit produces: `audit.reach_curve`, rows of `audit.summarize`, and `audit.Rate.to_dict`
rows (X, X_lo, X_hi, X_n). Figures are drawn on a bare `Figure` (no pyplot, no global backend change).
"""
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, MaxNLocator

DPI = 150
COMPONENT_COLORS = {"mlp": "tab:red", "attn": "tab:blue", "layer": "tab:gray"}
ARM_COLORS = {"block": "tab:gray", "top": "tab:red", "random": "tab:blue"}
ARM_LABELS = {"block": "whole block", "top": "top units along v", "random": "random units"}


def _require(df: pd.DataFrame, columns: Sequence[str], figure: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{figure}: table lacks columns {missing} (has {list(df.columns)})")
    if len(df) == 0:
        raise ValueError(f"{figure}: table is empty")


def _save(fig: Figure, path: Path | str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    return path


def _n(values: pd.Series) -> str:
    """A sample size for a title: one number, or the range when rows differ."""
    lo, hi = int(values.min()), int(values.max())
    return str(lo) if lo == hi else f"{lo}-{hi}"


def _band(ax: Axes, x, df: pd.DataFrame, name: str, label: str, color: str | None = None, marker: str = "o") -> None:
    line, = ax.plot(x, df[name], marker=marker, ms=3, label=label, color=color)
    ax.fill_between(x, df[f"{name}_lo"], df[f"{name}_hi"], color=line.get_color(), alpha=0.2, lw=0)


def _bars(ax: Axes, x, df: pd.DataFrame, name: str, label: str, color: str | None = None, marker: str = "o") -> None:
    y = df[name].to_numpy(dtype=float)
    err = np.vstack([y - df[f"{name}_lo"].to_numpy(dtype=float), df[f"{name}_hi"].to_numpy(dtype=float) - y])
    ax.errorbar(x, y, yerr=err, marker=marker, ms=4, capsize=3, label=label, color=color)


def plot_reach_curve(curve_df: pd.DataFrame, path: Path | str, title: str, deployed: float | None = None,
                     vote: float | None = None) -> Path:
    """reach@k vs k (log x) with its bootstrap band, from `audit.reach_curve` (k, reach, lo, hi, n, K).

    An optional `series` column draws one curve per series (e.g. random routes vs MCTS). `deployed` (D) is
    drawn as a horizontal line, `vote` (vote@K) as a marker at k = K.
    """
    _require(curve_df, ("k", "reach", "lo", "hi", "n", "K"), "reach curve")
    fig = Figure(figsize=(6, 4.2))
    ax = fig.add_subplot()
    groups = curve_df.groupby("series", sort=False) if "series" in curve_df.columns else [("oracle reach@k", curve_df)]
    for name, g in groups:
        line, = ax.plot(g["k"], g["reach"], marker="o", ms=3, label=str(name))
        ax.fill_between(g["k"], g["lo"], g["hi"], color=line.get_color(), alpha=0.2, lw=0)
    K = int(curve_df["K"].max())
    if deployed is not None:
        ax.axhline(deployed, color="black", ls="--", lw=1, label=f"deployed D = {deployed:.3f}")
    if vote is not None:
        ax.plot([K], [vote], marker="*", ms=12, color="tab:orange", ls="none", label=f"vote@{K} = {vote:.3f}")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("k (candidates)")
    ax.set_ylabel("share of questions correct")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(f"{title}\n(n = {_n(curve_df['n'])}, K = {_n(curve_df['K'])}; 95% bootstrap band)", fontsize=10)
    return _save(fig, path)


def plot_temperature_gap(df: pd.DataFrame, path: Path | str, title: str = "Selection gap vs temperature") -> Path:
    """Left: deployed D, vote@K and oracle O_K vs T (Wilson bands); right: selection gap O_K - vote@K vs T (paired bootstrap band).

    Rows are `{"T": T, **audit.summarize(records)}`.
    """
    need = ("T", "n", "K", *(f"{m}{s}" for m in ("D", "vote", "O", "selection_gap") for s in ("", "_lo", "_hi")))
    _require(df, need, "temperature gap")
    df = df.sort_values("T")
    fig = Figure(figsize=(10, 4))
    ax1, ax2 = fig.subplots(1, 2)
    K = int(df["K"].max())
    _band(ax1, df["T"], df, "O", f"oracle O_{K}", "tab:green")
    _band(ax1, df["T"], df, "vote", f"majority vote@{K}", "tab:orange")
    _band(ax1, df["T"], df, "D", "deployed D (greedy)", "black")
    ax1.set_ylabel("share of questions correct")
    ax1.set_ylim(0, 1.02)
    _band(ax2, df["T"], df, "selection_gap", f"O_{K} - vote@{K}", "tab:purple")
    ax2.axhline(0, color="black", lw=0.8)
    ax2.set_ylabel("selection gap (share of questions)")
    for ax in (ax1, ax2):
        ax.set_xlabel("sampling temperature T")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{title} (n = {_n(df['n'])}, K = {_n(df['K'])}; 95% intervals)", fontsize=10)
    return _save(fig, path)


def plot_census(df: pd.DataFrame, path: Path | str, title: str = "Recognition vs generation census") -> Path:
    """Generation accuracy vs recognition accuracy per cell with 95% intervals, y = x line; every cell labeled,
    cells meeting the criterion in red.

    Columns: cell, recognition_acc, generation_acc, n_fail (recognition-right, generation-wrong count; marker size),
    meets_criterion; optional: label (short point label, default cell), task (one marker shape per task),
    recognition_lo/_hi and generation_lo/_hi (error bars).
    """
    _require(df, ("cell", "recognition_acc", "generation_acc", "n_fail", "meets_criterion"), "census")
    fig = Figure(figsize=(6, 6))
    ax = fig.add_subplot()
    tasks = list(dict.fromkeys(df["task"])) if "task" in df else [None]
    markers = dict(zip(tasks, "osD^vP*X"))
    has_bars = all(c in df for c in ("recognition_lo", "recognition_hi", "generation_lo", "generation_hi"))
    for i, (_, r) in enumerate(df.sort_values("recognition_acc").iterrows()):
        meets = bool(r["meets_criterion"])
        color = "tab:red" if meets else "tab:gray"
        x, y = r["recognition_acc"], r["generation_acc"]
        if has_bars:
            ax.errorbar(x, y, xerr=[[x - r["recognition_lo"]], [r["recognition_hi"] - x]],
                        yerr=[[y - r["generation_lo"]], [r["generation_hi"] - y]], color=color, alpha=0.35, lw=0.8)
        ax.scatter([x], [y], s=15 + 8 * float(r["n_fail"]), c=color, marker=markers[r["task"] if "task" in df else None],
                   edgecolors="black" if meets else "none", alpha=0.9 if meets else 0.6, zorder=3)
        ax.annotate(str(r.get("label", r["cell"])), (x, y), fontsize=7, textcoords="offset points",
                    xytext=(6, 8 if i % 2 == 0 else -12), zorder=4)
    handles = [Line2D([], [], ls="none", marker="o", color="tab:red", markeredgecolor="black", label="meets criterion"),
               Line2D([], [], ls="none", marker="o", color="tab:gray", label="other cells")]
    handles += [Line2D([], [], ls="none", marker=markers[t], color="black", fillstyle="none", label=t)
                for t in tasks if t is not None]
    ax.plot([0, 1], [0, 1], color="black", lw=0.8, ls="--")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("recognition accuracy (gold option ranked first by likelihood)")
    ax.set_ylabel("generation accuracy (greedy answer correct)")
    ax.grid(alpha=0.3)
    ax.legend(handles=handles, fontsize=8, loc="upper left")
    ax.set_title(f"{title}\n({len(df)} cells, {int(df['meets_criterion'].astype(bool).sum())} meet the criterion; "
                 "size ~ failures; bars: 95% Wilson)", fontsize=9)
    return _save(fig, path)


def plot_layer_sweep(df: pd.DataFrame, path: Path | str, marked_layer: int | None = None,
                     title: str = "Silencing sweep") -> Path:
    """Repair (top) and healthy breakage (bottom) by layer, one line per component (mlp, attn, layer), Wilson error bars.

    Columns: layer, component, repair, repair_lo, repair_hi, repair_n, breakage, breakage_lo, breakage_hi, breakage_n.
    """
    need = ("layer", "component", *(f"{m}{s}" for m in ("repair", "breakage") for s in ("", "_lo", "_hi", "_n")))
    _require(df, need, "layer sweep")
    bad = sorted(set(df["component"]) - set(COMPONENT_COLORS))
    if bad:
        raise ValueError(f"layer sweep: components {bad} not in {list(COMPONENT_COLORS)}")
    fig = Figure(figsize=(7, 6))
    ax1, ax2 = fig.subplots(2, 1, sharex=True)
    for j, (comp, g) in enumerate(df.sort_values("layer").groupby("component", sort=False)):
        x = g["layer"] + 0.12 * (j - 1)  # dodge, so the error bars of the three components stay apart
        _bars(ax1, x, g, "repair", comp, COMPONENT_COLORS[comp])
        _bars(ax2, x, g, "breakage", comp, COMPONENT_COLORS[comp])
    ax1.set_ylabel("repair (failure set)")
    ax2.set_ylabel("breakage (healthy panel)")
    ax2.set_xlabel("layer silenced")
    for ax in (ax1, ax2):
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        if marked_layer is not None:
            ax.axvline(marked_layer, color="tab:red", lw=1, ls=":")
    ax2.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax1.legend(fontsize=8)
    fig.suptitle(f"{title} (n_fail = {_n(df['repair_n'])}, n_healthy = {_n(df['breakage_n'])}; "
                 f"95% Wilson)", fontsize=10)
    return _save(fig, path)


def plot_steering(df: pd.DataFrame, path: Path | str, title: str = "Steering along v") -> Path:
    """Rescue (-alpha v on the failure set) and induction (+alpha v on the healthy panel) vs alpha (log2 x), Wilson error bars.

    Columns: alpha, rescue, rescue_lo, rescue_hi, rescue_n, induction, induction_lo, induction_hi, induction_n.
    """
    need = ("alpha", *(f"{m}{s}" for m in ("rescue", "induction") for s in ("", "_lo", "_hi", "_n")))
    _require(df, need, "steering")
    df = df.sort_values("alpha")
    fig = Figure(figsize=(6, 4.2))
    ax = fig.add_subplot()
    _bars(ax, df["alpha"] * 0.97, df, "rescue", r"rescue: failures fixed by $-\alpha v$", "tab:green")
    _bars(ax, df["alpha"] * 1.03, df, "induction", r"induction: healthy broken by $+\alpha v$", "tab:red", marker="s")
    ax.set_xscale("log", base=2)
    ax.set_xticks(df["alpha"].unique(), [f"{a:g}" for a in df["alpha"].unique()])
    ax.set_xlabel(r"$\alpha$")
    ax.set_ylabel("share of questions")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{title}\n(n_fail = {_n(df['rescue_n'])}, n_healthy = {_n(df['induction_n'])}; "
                 f"95% Wilson)", fontsize=10)
    return _save(fig, path)


def plot_units(df: pd.DataFrame, path: Path | str, title: str = "Top units vs random units") -> Path:
    """Repair per case by arm: whole block, top units along v, random units; grouped bars with Wilson error bars.

    Long table, columns: case, arm (block | top | random), repair, repair_lo, repair_hi, repair_n.
    """
    _require(df, ("case", "arm", "repair", "repair_lo", "repair_hi", "repair_n"), "units")
    bad = sorted(set(df["arm"]) - set(ARM_COLORS))
    if bad:
        raise ValueError(f"units: arms {bad} not in {list(ARM_COLORS)}")
    cases = list(dict.fromkeys(df["case"]))
    arms = [a for a in ARM_COLORS if a in set(df["arm"])]
    width = 0.8 / len(arms)
    fig = Figure(figsize=(max(5.0, 1.2 * len(cases) + 2), 4.2))
    ax = fig.add_subplot()
    for j, arm in enumerate(arms):
        g = df[df["arm"] == arm].set_index("case").reindex(cases)
        x = np.arange(len(cases)) + (j - (len(arms) - 1) / 2) * width
        y = g["repair"].to_numpy(dtype=float)
        err = np.vstack([y - g["repair_lo"].to_numpy(dtype=float), g["repair_hi"].to_numpy(dtype=float) - y])
        ax.bar(x, y, width, yerr=err, capsize=3, color=ARM_COLORS[arm], label=ARM_LABELS[arm])
    n = df.groupby("case", sort=False)["repair_n"].max()
    ax.set_xticks(np.arange(len(cases)), [f"{c}\n(n = {int(n[c])})" for c in cases], fontsize=8)
    ax.set_ylabel("repair (failure set)")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    ax.set_title(f"{title}\n({len(cases)} cases; 95% Wilson)", fontsize=10)
    return _save(fig, path)
