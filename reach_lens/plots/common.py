"""What every figure shares: writing the PNG (``save``, 150 dpi), checking a table's columns, intervals as bands or
bars, a legend beside or under the axes, a y limit and point labels that keep the data in view, and the uniform
guesser's floor (``GUESSER`` names every floor line)."""
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

DPI = 150


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


GUESSER = "uniform guesser"  # the label of every guessing-floor line (figure tests find floors by it)


def _guesser_curve(ax: Axes, df: pd.DataFrame, k: str = "k", color: str = "gray") -> None:
    """The uniform guesser's reach@k (column ``guess``) as a dotted floor, when the table has a finite one."""
    if "guess" not in df.columns:
        return
    g = df.drop_duplicates(k).sort_values(k)
    if np.isfinite(g["guess"].to_numpy(dtype=float)).any():
        ax.plot(g[k], g["guess"], color=color, ls=":", lw=1.3, label=f"{GUESSER}: 1-(1-1/m)^k")
