"""The recognition vs generation census: generation vs recognition accuracy, one point per model x task cell."""
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from reach_lens.plots.common import _finish, _require, legend_outside, place_labels


def plot_census(df: pd.DataFrame, path: Path | str | None = None,
                title: str = "Recognition vs generation census") -> Figure:
    """Generation accuracy vs recognition accuracy per cell with 95% intervals, y = x line; every cell labeled
    (labels placed clear of each other and of the points), cells meeting the criterion in red.

    Columns: cell, recognition_acc, generation_acc, n_fail (recognition-right, generation-wrong count; marker size),
    meets_criterion; optional: label (short point label, default cell), task (one marker shape per task),
    recognition_lo/_hi and generation_lo/_hi (error bars), chance (a uniform guesser's accuracy, 1/m: drawn as
    dotted lines on both axes, one pair per value, naming its tasks).
    """
    _require(df, ("cell", "recognition_acc", "generation_acc", "n_fail", "meets_criterion"), "census")
    fig = Figure(figsize=(6, 6))
    ax = fig.add_subplot()
    tasks = list(dict.fromkeys(df["task"])) if "task" in df else [None]
    markers = dict(zip(tasks, "osD^vP*X"))
    has_bars = all(c in df for c in ("recognition_lo", "recognition_hi", "generation_lo", "generation_hi"))
    for _, r in df.sort_values("recognition_acc").iterrows():
        meets = bool(r["meets_criterion"])
        color = "tab:red" if meets else "tab:gray"
        x, y = r["recognition_acc"], r["generation_acc"]
        if has_bars:
            ax.errorbar(x, y, xerr=[[x - r["recognition_lo"]], [r["recognition_hi"] - x]],
                        yerr=[[y - r["generation_lo"]], [r["generation_hi"] - y]], color=color, alpha=0.35, lw=0.8)
        ax.scatter([x], [y], s=15 + 8 * float(r["n_fail"]), c=color, marker=markers[r["task"] if "task" in df else None],
                   edgecolors="black" if meets else "none", alpha=0.9 if meets else 0.6, zorder=3)
    handles = [Line2D([], [], ls="none", marker="o", color="tab:red", markeredgecolor="black", label="meets criterion"),
               Line2D([], [], ls="none", marker="o", color="tab:gray", label="other cells")]
    handles += [Line2D([], [], ls="none", marker=markers[t], color="black", fillstyle="none", label=t)
                for t in tasks if t is not None]
    if "chance" in df:
        for j, (chance, g) in enumerate(df.groupby(df["chance"].round(2), sort=True)):  # ARC's 3-5 options: ~25%
            style = dict(color=("tab:blue", "tab:purple", "tab:brown", "tab:olive")[j % 4], lw=1.0, ls=":", zorder=1)
            ax.axvline(chance, **style)
            ax.axhline(chance, **style)
            handles.append(Line2D([], [], **style, label=f"chance {chance:.0%} ({', '.join(dict.fromkeys(g.task))})"))
    ax.plot([0, 1], [0, 1], color="black", lw=0.8, ls="--")
    handles.append(Line2D([], [], color="black", lw=0.8, ls="--", label="generation = recognition"))
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    cells = df.sort_values("recognition_acc")
    place_labels(ax, list(zip(cells["recognition_acc"], cells["generation_acc"])),
                 [str(r.get("label", r["cell"])) for _, r in cells.iterrows()],
                 radius=np.sqrt((15 + 8 * cells["n_fail"].to_numpy(dtype=float)) / np.pi), zorder=4)
    ax.set_xlabel("recognition accuracy (gold option ranked first by likelihood)")
    ax.set_ylabel("generation accuracy (greedy answer correct)")
    ax.grid(alpha=0.3)
    legend_outside(ax, handles=handles, fontsize=8)
    ax.set_title(f"{title}\n({len(df)} cells, {int(df['meets_criterion'].astype(bool).sum())} meet the criterion; "
                 "size ~ failures; bars: 95% Wilson)", fontsize=9)
    return _finish(fig, path)
