"""One function per figure kind: each takes a DataFrame, returns the matplotlib ``Figure``, and writes it as a PNG
(150 dpi) when given a ``path`` (``save(fig, path)`` writes any of them later).

The tables are those audit produces: `audit.reach_curve`, rows of `audit.summarize`, and `audit.Rate.to_dict`
rows (X, X_lo, X_hi, X_n); and for the routing and selection studies those of `reach_lens.routing.analysis`. Figures are drawn on a bare `Figure` (no pyplot, no global backend change).
"""
import textwrap
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


def _require(df: pd.DataFrame, columns: Sequence[str], figure: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{figure}: table lacks columns {missing} (has {list(df.columns)})")
    if len(df) == 0:
        raise ValueError(f"{figure}: table is empty")


def save(fig: Figure, path: Path | str) -> Path:
    """Write ``fig`` as a PNG at ``path`` (parents created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    return path


def _finish(fig: Figure, path: Path | str | None) -> Figure:
    if path is not None:
        save(fig, path)
    return fig


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


def legend_outside(ax: Axes, where: str = "right", **kwargs) -> None:
    """A legend beside (``right``) or under (``below``) the axes, never over its data; ``kwargs`` go to ``legend``."""
    if where == "right":
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, **kwargs)
    else:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), borderaxespad=0.0, **kwargs)


def data_top(*values, floor: float = 0.05) -> float:
    """An upper y limit for shares that keeps the highest finite value (and its interval) in view with headroom:
    1.02 when the data reach past 0.8, else 1.15 x the highest value (free-form shares often stay low)."""
    finite = [float(v) for vs in values for v in np.ravel(np.asarray(vs, dtype=float)) if np.isfinite(v)]
    top = max(finite, default=1.0)
    return 1.02 if top > 0.8 else max(floor, 1.15 * top)


_LABEL_OFFSETS = [(dx, dy) for r in (1.0, 1.8, 2.8, 4.0) for dx, dy in
                  ((7 * r, 5 * r), (7 * r, -9 * r), (-7 * r, 5 * r), (-7 * r, -9 * r), (0, 9 * r), (0, -13 * r))]


def place_labels(ax: Axes, points: Sequence[tuple[float, float]], texts: Sequence[str], fontsize: float = 7,
                 radius: float | Sequence[float] = 4.0, **kwargs) -> list:
    """Annotate each data point with its text at the first offset (nearest first) where the label stays inside
    the axes and overlaps no other label and no point (a box of ``radius`` points around each: one value or one
    per point); the last offset tried is kept when none is free. Call after the axes' limits are set. Returns
    the annotations."""
    renderer = FigureCanvasAgg(ax.figure).get_renderer()
    frame = ax.get_window_extent(renderer)
    centers = ax.transData.transform(np.asarray(points, dtype=float).reshape(-1, 2))
    pixels = np.broadcast_to(np.asarray(radius, dtype=float), (len(centers),)) * ax.figure.dpi / 72
    taken = [(x - r, y - r, x + r, y + r) for (x, y), r in zip(centers, pixels)]
    placed = []
    for (x, y), text in zip(points, texts):
        for dx, dy in _LABEL_OFFSETS:
            ann = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=fontsize,
                              ha="left" if dx > 0 else "right" if dx < 0 else "center", va="center", **kwargs)
            b = ann.get_window_extent(renderer)
            box = (b.x0, b.y0, b.x1, b.y1)
            inside = frame.x0 <= b.x0 and b.x1 <= frame.x1 and frame.y0 <= b.y0 and b.y1 <= frame.y1
            if inside and not any(box[0] < t[2] and t[0] < box[2] and box[1] < t[3] and t[1] < box[3] for t in taken):
                break
            if (dx, dy) != _LABEL_OFFSETS[-1]:
                ann.remove()
        taken.append(box)
        placed.append(ann)
    return placed


LABELLED_CELLS = 6  # random-minus-structured dots get their cell's name up to this many per method
GUESSER = "uniform guesser"  # the label of every guessing-floor line (figure tests find floors by it)


def _guesser_curve(ax: Axes, df: pd.DataFrame, k: str = "k", color: str = "gray") -> None:
    """The uniform guesser's reach@k (column ``guess``) as a dotted floor, when the table has a finite one."""
    if "guess" not in df.columns:
        return
    g = df.drop_duplicates(k).sort_values(k)
    if np.isfinite(g["guess"].to_numpy(dtype=float)).any():
        ax.plot(g[k], g["guess"], color=color, ls=":", lw=1.3, label=f"{GUESSER}: 1-(1-1/m)^k")


def plot_reach_curve(curve_df: pd.DataFrame, path: Path | str | None = None, title: str = "reach@k",
                     deployed: float | None = None, vote: float | None = None) -> Figure:
    """reach@k vs k (log x) with its bootstrap band, from `audit.reach_curve` (k, reach, lo, hi, n, K).

    An optional `series` column draws one curve per series (e.g. random routes vs MCTS). `deployed` (D) is
    drawn as a horizontal line, `vote` (vote@K) as a marker at k = K. A `guess` column (multiple choice: the
    uniform guesser's 1 - (1 - 1/m)^k, `audit.guesser_reach`; NaN for free-form answers) is drawn as the floor.
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


# ---- routing and selection (tables of `reach_lens.routing.analysis`) ----------------------------------

SERIES_COLORS = {"random": "tab:blue", "random_uniform": "tab:cyan", "mcts": "tab:red", "hill_climb": "tab:green", "genetic": "tab:purple",
                 "random vote": "tab:orange"}



SERIES_LABELS = {"random": "random routes, geometric law", "random_uniform": "random routes, uniform law",
                 "mcts": "MCTS", "hill_climb": "hill climbing", "genetic": "genetic search",
                 "random vote": "majority vote over the random routes"}
SERIES_MARKERS = {"random": "o", "random_uniform": "o", "mcts": "s", "hill_climb": "^", "genetic": "D",
                  "random vote": "v"}


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


# ---- MLP study: units relative to the whole block (the paper's Fig 5c) ----------------------------------


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


# ---- RLVR checkpoint study (reach_lens.rlvr.tables): Figures 6a, 6b, 7 and the lineage table with its floors


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
    """Figure 6b from `rlvr.tables.table5` rows (+ T): per pair, the change of deployed D and of the oracle O_K
    side by side, with paired bootstrap 95% intervals, in percentage points; under each pair, its O_K before and
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
    ax.set_title(f"{title}\n({_protocol_note(df)}; paired bootstrap 95%)", fontsize=10)
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

    One panel per K (the bins follow K: `audit.hit_rate_bins`), each with its own bins on x (ticks: the bin in hits
    of K and, with hits_lo/hits_hi columns, its hit rates); one colour per checkpoint (pair) across all panels
    (`CHECKPOINT_COLORS`, in table order), one marker per K. The legend (colours: checkpoints; markers: K and its
    panel; the expected tick) sits right of the last panel, off the data."""
    need = ("pair", "K", "T", "bin", "n", "realization", "realization_lo", "realization_hi")
    _require(df, need, "rlvr propensity")
    pairs = list(dict.fromkeys(df["pair"]))
    colors = {p: CHECKPOINT_COLORS[i % len(CHECKPOINT_COLORS)] for i, p in enumerate(pairs)}
    Ks = sorted({int(k) for k in df["K"]})
    markers = {K: "os^Dv"[i % 5] for i, K in enumerate(Ks)}
    bins = {K: list(dict.fromkeys(df.loc[df["K"] == K, "bin"])) for K in Ks}
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
    fig.supxlabel("base hits of K (hit rate) of questions the base does not realize; numbers: questions in the bin "
                  "(0 at the bottom: an empty bin)", fontsize=8)
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
    """Table 7 as a figure, from `rlvr.tables.table7` rows (+ T): per checkpoint, deployed D, majority vote@K
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


def plot_rlvr_reach_curves(curves: pd.DataFrame, crossings: pd.DataFrame, path: Path | str | None = None,
                           title: str = "reach@k, base vs trained") -> Figure:
    """reach@k of each lineage from `rlvr.tables.reach_curves` (checkpoint, k, reach, lo, hi, n, K; + T optional)
    and `rlvr.tables.crossovers` (pair, base, K, k_cross, k_min_gap, min_gap, min_gap_lo, min_gap_hi): one panel
    per (base, trained) pair, stacked, each with the base's curve (black) and the trained one's (one colour per
    pair, `CHECKPOINT_COLORS`) and their 95% question-bootstrap bands on a log k axis (base 2). The k where the
    base overtakes is a dashed red line; when the trained curve stays ahead up to K the panel title says "no
    crossover up to K = .." and a dotted line marks the k of the smallest gap (its value and paired 95% interval
    in the legend). A ``guess`` column (multiple choice: the uniform guesser's 1 - (1 - 1/m)^k; NaN for free-form)
    is drawn as each panel's floor. Each panel's legend sits right of it, off the data."""
    _require(curves, ("checkpoint", "k", "reach", "lo", "hi", "n", "K"), "rlvr reach curves")
    _require(crossings, ("pair", "base", "K", "k_cross", "k_min_gap", "min_gap", "min_gap_lo", "min_gap_hi"),
             "rlvr crossovers")
    fig = Figure(figsize=(9.0, 2.9 * len(crossings) + 0.9))
    axes = fig.subplots(len(crossings), 1, squeeze=False)[:, 0]
    fig.subplots_adjust(right=0.64, hspace=0.45, top=1 - 0.75 / (2.9 * len(crossings) + 0.9))
    for i, (ax, (_, row)) in enumerate(zip(axes, crossings.iterrows())):
        tops = []
        for label, color, role in ((row["base"], "black", "base"),
                                   (row["pair"], CHECKPOINT_COLORS[i % len(CHECKPOINT_COLORS)], "trained")):
            g = curves[curves["checkpoint"] == label].sort_values("k")
            if len(g) == 0:
                raise ValueError(f"rlvr reach curves: no curve for checkpoint {label!r} (has "
                                 f"{list(dict.fromkeys(curves['checkpoint']))})")
            ax.plot(g["k"], g["reach"], marker="o", ms=2, lw=1.3, color=color, label=f"{label} ({role})")
            ax.fill_between(g["k"], g["lo"], g["hi"], color=color, alpha=0.15, lw=0)
            tops.append(g["hi"])
        base_curve = curves[curves["checkpoint"] == row["base"]]
        _guesser_curve(ax, base_curve)
        tops.append(base_curve["guess"] if "guess" in base_curve else [])
        K = int(row["K"])
        if pd.isna(row["k_cross"]):
            ax.axvline(row["k_min_gap"], color="gray", ls=":", lw=1.2,
                       label=f"smallest gap, k = {int(row['k_min_gap'])}:\n{100 * row['min_gap']:+.1f} pp "
                             f"[{100 * row['min_gap_lo']:+.1f}, {100 * row['min_gap_hi']:+.1f}]")
            head = f"{row['pair']}: no crossover up to K = {K}"
        else:  # k_cross = 1: the trained curve is never ahead
            what = "base overtakes at" if row["k_cross"] > 1 else "base at or above it from"
            ax.axvline(row["k_cross"], color="tab:red", ls="--", lw=1.2, label=f"{what} k = {int(row['k_cross'])}")
            head = f"{row['pair']}: {what} k = {int(row['k_cross'])} (of K = {K})"
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_ylim(0, data_top(*tops))
        ax.set_ylabel("reach@k")
        ax.grid(alpha=0.3)
        ax.set_title(head, fontsize=9)
        legend_outside(ax, fontsize=8)
    axes[-1].set_xlabel("k (samples, of K)")
    note = f", T = {float(curves['T'].iloc[0]):g}" if "T" in curves.columns else ""
    fig.suptitle(f"{title}\n(n = {_n(curves['n'])}, K = {_n(curves['K'])}{note}; unbiased pass@k, "
                 "95% question-bootstrap bands)", fontsize=10)
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
