"""The MLP-localization study's figures: the silencing sweep by layer, steering along v vs alpha, and the top units
along v against random units, relative to the whole block (the paper's Fig 5c)."""
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from reach_lens.plots.common import _bars, _finish, _n, _require, legend_outside

COMPONENT_COLORS = {"mlp": "tab:red", "attn": "tab:blue", "layer": "tab:gray"}
ARM_COLORS = {"block": "tab:gray", "top": "tab:red", "random": "tab:blue"}


def plot_layer_sweep(df: pd.DataFrame, path: Path | str | None = None, marked_layer: int | None = None,
                     title: str = "Silencing sweep", runner_ups: Sequence[tuple[str, int, str]] = (),
                     evaluation: pd.DataFrame | None = None) -> Figure:
    """Repair (top) and healthy breakage (bottom) by layer, one line per component (mlp, attn, layer), Wilson error bars.

    Columns: layer, component, repair, repair_lo, repair_hi, repair_n, breakage, breakage_lo, breakage_hi, breakage_n.
    ``marked_layer``: a dotted line (the identified MLP). ``runner_ups``: (component, layer, label) rings on those
    sweep points, numbered R1, R2, ... in the legend. ``evaluation``: rows of the same columns measured on other
    questions (the evaluation split), drawn as black diamonds with their own error bars.
    """
    need = ("layer", "component", *(f"{m}{s}" for m in ("repair", "breakage") for s in ("", "_lo", "_hi", "_n")))
    _require(df, need, "layer sweep")
    bad = sorted(set(df["component"]) - set(COMPONENT_COLORS))
    if bad:
        raise ValueError(f"layer sweep: components {bad} not in {list(COMPONENT_COLORS)}")
    fig = Figure(figsize=(8, 6.5))
    ax1, ax2 = fig.subplots(2, 1, sharex=True)
    dodge = {c: 0.12 * (j - 1) for j, c in enumerate(COMPONENT_COLORS)}  # keeps the three components' bars apart
    for comp, g in df.sort_values("layer").groupby("component", sort=False):
        x = g["layer"] + dodge[comp]
        _bars(ax1, x, g, "repair", comp, COMPONENT_COLORS[comp])
        _bars(ax2, x, g, "breakage", comp, COMPONENT_COLORS[comp])
    points = df.set_index(["component", "layer"])
    for i, (comp, layer, label) in enumerate(runner_ups, start=1):
        if (comp, layer) not in points.index:
            continue
        for ax, name in ((ax1, "repair"), (ax2, "breakage")):
            ax.plot([layer + dodge[comp]], [points.loc[(comp, layer), name]], "o", ms=13, mfc="none",
                    mec=COMPONENT_COLORS[comp], mew=1.6, label=f"R{i}: {comp} {layer} ({label})" if ax is ax1 else None)
        ax1.annotate(f"R{i}", (layer + dodge[comp], points.loc[(comp, layer), "repair"]), textcoords="offset points",
                     xytext=(6, 7), fontsize=8, color=COMPONENT_COLORS[comp], fontweight="bold")
    if evaluation is not None and len(evaluation):
        e = evaluation.assign(x=evaluation["layer"] + 0.33 + 1.6 * evaluation["component"].map(dodge).fillna(0.0))
        for ax, name in ((ax1, "repair"), (ax2, "breakage")):
            y = e[name].to_numpy(dtype=float)
            err = np.vstack([y - e[f"{name}_lo"].to_numpy(dtype=float), e[f"{name}_hi"].to_numpy(dtype=float) - y])
            label = (f"evaluation split (n_fail = {_n(e['repair_n'])}, n_healthy = {_n(e['breakage_n'])}): "
                     "M / A / L = MLP / attention / whole layer") if ax is ax1 else None
            ax.errorbar(e["x"], y, yerr=err, ls="none", marker="D", ms=5, mfc="white", mec="black", color="black",
                        capsize=2, lw=0.8, label=label)
            for x, value, comp in zip(e["x"], y, e["component"]):
                ax.annotate({"mlp": "M", "attn": "A", "layer": "L"}.get(comp, "?"), (x, value), textcoords="offset points",
                            xytext=(0, -11), ha="center", fontsize=6)
    ax1.set_ylabel("repair (failure set)")
    ax2.set_ylabel("breakage (healthy panel)")
    ax2.set_xlabel("layer silenced")
    for ax in (ax1, ax2):
        ax.set_ylim(-0.04, 1.04)
        ax.grid(alpha=0.3)
        if marked_layer is not None:
            ax.axvline(marked_layer, color="tab:red", lw=1, ls=":")
    ax2.xaxis.set_major_locator(MaxNLocator(integer=True))
    handles, labels = ax1.get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, 0.02), ncols=2)
    split = "calibration " if evaluation is not None else ""
    fig.suptitle(f"{title}\n({split}n_fail = {_n(df['repair_n'])}, n_healthy = {_n(df['breakage_n'])}; "
                 f"95% Wilson" + ("; dotted: identified MLP" if marked_layer is not None else "") + ")", fontsize=10)
    return _finish(fig, path)


def plot_steering(df: pd.DataFrame, path: Path | str | None = None, title: str = "Steering along v",
                  doses: dict | None = None) -> Figure:
    """Rescue (-alpha v on the failure set) and induction (+alpha v on the healthy panel) vs alpha (log2 x), Wilson error bars.

    Columns: alpha, rescue, rescue_lo, rescue_hi, rescue_n, induction, induction_lo, induction_hi, induction_n;
    optional ``role``: evaluation rows are drawn with error bars, calibration rows as thin dashed lines.
    ``doses`` ({"rescue": alpha, "induction": alpha}, chosen on calibration) are starred on the evaluation curves.
    """
    need = ("alpha", *(f"{m}{s}" for m in ("rescue", "induction") for s in ("", "_lo", "_hi", "_n")))
    _require(df, need, "steering")
    df = df.sort_values("alpha")
    main = df[df["role"] == "evaluation"] if "role" in df else df
    fig = Figure(figsize=(6.5, 4.5))
    ax = fig.add_subplot()
    colors = {"rescue": "tab:green", "induction": "tab:red"}
    split = " (evaluation)" if "role" in df else ""
    _bars(ax, main["alpha"] * 0.97, main, "rescue", r"rescue: failures fixed by $-\alpha v$" + split, colors["rescue"])
    _bars(ax, main["alpha"] * 1.03, main, "induction", r"induction: healthy broken by $+\alpha v$" + split,
          colors["induction"], marker="s")
    if "role" in df:
        cal = df[df["role"] == "calibration"]
        for name in ("rescue", "induction"):
            ax.plot(cal["alpha"], cal[name], ls="--", lw=1, marker="o", ms=3, mfc="none", color=colors[name],
                    label=f"{name} (calibration, n = {_n(cal[f'{name}_n'])})")
    if "role" in df:
        rand = df[df["role"] == "random direction"]
        for name in ("rescue", "induction"):
            r = rand.dropna(subset=[name])
            if len(r):
                ax.plot(r["alpha"], r[name], "X", ms=8, color=colors[name], mec="black", mew=0.6,
                        label=f"{name}, random direction of |v| (evaluation)")
    for name, alpha in (doses or {}).items():
        row = main[main["alpha"] == alpha]
        if len(row):
            ax.plot([alpha * (0.97 if name == "rescue" else 1.03)], [row[name].iloc[0]], "*", ms=14, color=colors[name],
                    mec="black", label=f"{name} dose chosen on calibration: {alpha:g}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(df["alpha"].unique(), [f"{a:g}" for a in df["alpha"].unique()])
    ax.set_xlabel(r"$\alpha$")
    ax.set_ylabel("share of questions")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    legend_outside(ax, fontsize=7)
    ax.set_title(f"{title}\n(n_fail = {_n(main['rescue_n'])}, n_healthy = {_n(main['induction_n'])}; "
                 f"95% Wilson)", fontsize=10)
    return _finish(fig, path)


def plot_units_vs_block(df: pd.DataFrame, path: Path | str | None = None,
                        title: str = "Top units vs random units") -> Figure:
    """Left: repair of the top-k units along v and of random-k sets, relative to the whole block's repair (bars:
    random sets' SD); right: their share of the block's output mass. Every bar is labelled with its n.

    Rows (``localize.unit_arms``): arm (block | top | random), repair, repair_k, repair_n, repair_vs_block, mass.
    When the whole block repairs nothing the left panel shows raw repair and says so.
    """
    _require(df, ("arm", "repair", "repair_k", "repair_n", "repair_vs_block", "mass"), "units vs block")
    block, top, rand = df[df.arm == "block"], df[df.arm == "top"], df[df.arm == "random"]
    if len(block) != 1 or len(top) != 1 or len(rand) == 0:
        raise ValueError(f"units vs block: need one block row, one top row and random rows, got arms {list(df.arm)}")
    normalized = bool(np.isfinite(top.repair_vs_block.iloc[0]))
    value = "repair_vs_block" if normalized else "repair"
    what = str(df.space.iloc[0]).split()[-1] if "space" in df else "units"  # units | latents
    k = int(block.repair_k.iloc[0]), int(block.repair_n.iloc[0])
    fig = Figure(figsize=(9, 4.2))
    ax1, ax2 = fig.subplots(1, 2)
    for ax, column, ylabel in ((ax1, value, "repair relative to the whole block" if normalized else
                                "repair (the whole block repairs 0: not normalized)"),
                               (ax2, "mass", "share of the SAE decoder's output mass" if what == "latents" else
                                "share of the block's output mass")):
        heights = [float(top[column].iloc[0]), float(rand[column].mean())]
        sd = [0.0, float(rand[column].std(ddof=1)) if len(rand) > 1 else 0.0]
        bars = ax.bar([0, 1], heights, 0.6, yerr=sd, capsize=4, color=[ARM_COLORS["top"], ARM_COLORS["random"]])
        n_top, n_rand = int(top.repair_n.iloc[0]), int(rand.repair_n.iloc[0])
        if column == "mass":
            labels = [f"{heights[0]:.1%}\n(n = {n_top})", f"{heights[1]:.1%} ± {sd[1]:.1%}\n(n = {n_rand} x {len(rand)} sets)"]
        else:
            labels = [f"n = {n_top}\n({int(top.repair_k.iloc[0])} repaired)",
                      f"n = {n_rand} x {len(rand)} sets\n(mean {rand.repair_k.mean():.1f} repaired)"]
        for bar, label, h, e in zip(bars, labels, heights, sd):
            ax.annotate(label, (bar.get_x() + bar.get_width() / 2, h + e), textcoords="offset points", xytext=(0, 3),
                        ha="center", va="bottom", fontsize=7)
        ax.set_xticks([0, 1], [f"top {what} along v", f"random {what} (mean ± SD)"], fontsize=8)
        ax.set_ylabel(ylabel, fontsize=9)
        highest = max(h + e for h, e in zip(heights, sd))
        ax.set_ylim(0, max(1.0, highest * 1.3) if column != "mass" else max(0.05, highest * 1.4))
        ax.grid(alpha=0.3, axis="y")
    if normalized:
        ax1.axhline(1.0, color="black", lw=0.8, ls="--", label="whole block = 1")
        ax1.set_ylim(0, max(1.15, ax1.get_ylim()[1]))
        legend_outside(ax1, "below", fontsize=7)
    ax2.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0%}" if v >= 0.1 else f"{v:.1%}"))
    fig.suptitle(f"{title}\n(whole block repairs {k[0]}/{k[1]} evaluation failures; error bars: SD over random sets)",
                 fontsize=10)
    return _finish(fig, path)
