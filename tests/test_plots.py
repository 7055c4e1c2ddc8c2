"""Every figure kind draws the data of its table: the artists of each figure are read back and compared with
the input (a PNG of a rendered canvas is also written)."""
import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PathCollection, PolyCollection
from matplotlib.colors import to_rgba
from matplotlib.container import BarContainer, ErrorbarContainer

from conftest import legends_off_data

from reach_lens import plots
from reach_lens.audit import gap_curve, reach_curve, summarize
from reach_lens.stats import breakage_rate, repair_rate
from reach_lens.records import make_record
from reach_lens.select import majority_vote

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def drawn(monkeypatch):
    """{path name: Figure} of every figure the plot functions save during the test; each is checked to keep its
    legends off every axes' data area."""
    figures = {}
    save = plots.common.save  # what every plot function saves with

    def capture(fig, path):
        out = save(fig, path)
        assert out.read_bytes()[:8] == PNG_MAGIC
        assert legends_off_data(fig), f"{out.name}: a legend lies over an axes' data area"
        figures[out.name] = fig
        return out

    monkeypatch.setattr(plots.common, "save", capture)
    return figures


def lines(ax, label=None):
    return [ln for ln in ax.get_lines() if label is None or ln.get_label() == label]


def line(ax, label):
    found = lines(ax, label)
    assert len(found) == 1, [ln.get_label() for ln in ax.get_lines()]
    return found[0]


def band(collection):
    """(x, y) vertices of a fill_between polygon."""
    return collection.get_paths()[0].vertices


def _records(hits, d, K=8):
    cands = [[{"text": "", "answer": "g" if k < h else "w", "correct": k < h, "mean_logprob": -1.0, "length": 5}
              for k in range(K)] for h in hits]
    return pd.DataFrame([make_record(i, "g", {"text": "", "answer": "g" if di else "w", "correct": bool(di)},
                                     cs, majority_vote(cs))
                         for i, (cs, di) in enumerate(zip(cands, d))])


RECS = _records([0, 1, 3, 8, 0, 2, 5, 0], [0, 0, 1, 1, 0, 0, 1, 0])


def test_plot_reach_curve(tmp_path, drawn):
    curve = reach_curve(RECS, n_boot=100)
    s = summarize(RECS, n_boot=100)
    out = plots.plot_reach_curve(curve, tmp_path / "reach.png", "toy", deployed=s["D"], vote=s["vote"])
    assert out is drawn["reach.png"]  # the figure itself, also saved at the path
    ax = drawn["reach.png"].axes[0]
    reach = line(ax, "oracle reach@k")
    np.testing.assert_allclose(reach.get_xdata(), curve.k)
    np.testing.assert_allclose(reach.get_ydata(), curve.reach)
    ys = band(ax.collections[0])[:, 1]
    assert ys.min() == pytest.approx(curve.lo.min()) and ys.max() == pytest.approx(curve.hi.max())
    assert line(ax, f"deployed D = {s['D']:.3f}").get_ydata()[0] == pytest.approx(s["D"])
    star = line(ax, f"vote@8 = {s['vote']:.3f}")
    assert (star.get_xdata()[0], star.get_ydata()[0]) == (8, pytest.approx(s["vote"]))
    assert "n = 8, K = 8" in ax.get_title()

    other = reach_curve(_records([1] * 8, [0] * 8), n_boot=100)
    two = pd.concat([curve.assign(series="random"), other.assign(series="mcts")])
    plots.plot_reach_curve(two, tmp_path / "sub" / "two.png", "two series")
    ax = drawn["two.png"].axes[0]
    np.testing.assert_allclose(line(ax, "random").get_ydata(), curve.reach)
    np.testing.assert_allclose(line(ax, "mcts").get_ydata(), other.reach)


def test_plot_gap_curves(tmp_path, drawn):
    free = gap_curve(RECS, n_boot=100).assign(cell="squad", guess_gap=np.nan)
    mc = gap_curve(_records([1] * 8, [1, 0] * 4), n_boot=100)
    mc = mc.assign(cell="arc_easy", guess_gap=1 - 0.75 ** mc["k"] - 0.5)
    plots.plot_gap_curves(pd.concat([free, mc]), tmp_path / "gaps.png", "toy")
    ax = drawn["gaps.png"].axes[0]
    for cell, g in (("squad", free), ("arc_easy", mc)):
        np.testing.assert_allclose(line(ax, cell).get_xdata(), g.k)
        np.testing.assert_allclose(line(ax, cell).get_ydata(), g.gap)
    np.testing.assert_allclose(line(ax, f"arc_easy: {plots.GUESSER}").get_ydata(), mc.guess_gap)
    assert not lines(ax, f"squad: {plots.GUESSER}")  # a free-form cell has no guesser
    assert len(ax.collections) == 2 and "n = 8, K = 8" in ax.get_title()


def test_plot_temperature_gap(tmp_path, drawn):
    df = pd.DataFrame([{"T": T, **summarize(_records(h, d), n_boot=100)}
                       for T, h, d in ((1.2, [2, 3, 5, 6], [0, 0, 1, 1]), (0.2, [0, 1, 8, 8], [0, 0, 1, 1]),
                                       (0.8, [0, 3, 5, 8], [0, 0, 1, 1]))])
    plots.plot_temperature_gap(df, tmp_path / "t.png")
    left, right = drawn["t.png"].axes
    df = df.sort_values("T")
    bars = {c.get_label(): c for c in left.containers if isinstance(c, ErrorbarContainer)}
    for (label, column), dx in zip((("oracle O_8", "O"), ("majority vote@8", "vote"), ("deployed D (greedy)", "D")),
                                   (-0.012, 0.0, 0.012)):
        ln = bars[label].lines[0]
        np.testing.assert_allclose(np.asarray(ln.get_xdata(), dtype=float), df["T"] + dx)  # side by side
        np.testing.assert_allclose(np.asarray(ln.get_ydata(), dtype=float), df[column])
        segments = bars[label].lines[2][0].get_segments()
        np.testing.assert_allclose([seg[:, 1] for seg in segments], df[[f"{column}_lo", f"{column}_hi"]].to_numpy())
    np.testing.assert_allclose(line(right, "O_8 - vote@8").get_ydata(), df.selection_gap)


def test_plot_census(tmp_path, drawn):
    df = pd.DataFrame({"cell": ["a", "b", "c"], "recognition_acc": [0.5, 0.7, 0.3],
                       "generation_acc": [0.3, 0.7, 0.35], "n_fail": [8, 1, 0], "meets_criterion": [True, False, False]})
    plots.plot_census(df, tmp_path / "census.png")
    ax = drawn["census.png"].axes[0]
    points = {tuple(c.get_offsets()[0]): c for c in ax.collections if isinstance(c, PathCollection)}
    assert set(points) == set(zip(df.recognition_acc, df.generation_acc))
    for r in df.itertuples():
        color = to_rgba("tab:red" if r.meets_criterion else "tab:gray")
        assert tuple(points[(r.recognition_acc, r.generation_acc)].get_facecolor()[0][:3]) == pytest.approx(color[:3])
    assert sorted(t.get_text() for t in ax.texts) == ["a", "b", "c"]
    assert "1 meet the criterion" in ax.get_title()

    # crowded cells: every label is placed clear of the other labels; chance lines per option count
    crowded = pd.DataFrame({"cell": [f"model {i} / task" for i in range(5)], "recognition_acc": [0.3, 0.31, 0.29, 0.3, 0.32],
                            "generation_acc": [0.25, 0.26, 0.24, 0.27, 0.25], "n_fail": 10, "meets_criterion": False,
                            "task": ["arc_easy", "arc_easy", "piqa", "piqa", "arc_easy"],
                            "chance": [0.25, 0.25, 0.5, 0.5, 0.25]})
    plots.plot_census(crowded, tmp_path / "crowded.png")
    fig = drawn["crowded.png"]
    ax, renderer = fig.axes[0], fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in ax.texts]
    assert len(boxes) == 5 and not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "chance 25% (arc_easy)" in legend and "chance 50% (piqa)" in legend
    assert {ln.get_xdata()[0] for ln in ax.get_lines() if list(ln.get_xdata()) == [ln.get_xdata()[0]] * 2} >= {0.25, 0.5}


def test_plot_layer_sweep(tmp_path, drawn):
    rows = []
    for layer in range(4):
        for j, comp in enumerate(("mlp", "attn", "layer")):
            rep = repair_rate([False] * 8, [i < (2 * layer + j) % 9 for i in range(8)])
            brk = breakage_rate([True] * 10, [i >= layer + 2 * j for i in range(10)])
            rows.append({"layer": layer, "component": comp, **rep.to_dict("repair"), **brk.to_dict("breakage")})
    df = pd.DataFrame(rows)
    plots.plot_layer_sweep(df, tmp_path / "sweep.png", marked_layer=2)
    top, bottom = drawn["sweep.png"].axes[:2]
    for ax, metric in ((top, "repair"), (bottom, "breakage")):
        bars = {c.get_label(): c for c in ax.containers if isinstance(c, ErrorbarContainer)}
        for comp, g in df.groupby("component"):
            ln = bars[comp].lines[0]
            np.testing.assert_allclose(np.asarray(ln.get_ydata(), float), g.sort_values("layer")[metric])
            np.testing.assert_allclose(np.round(np.asarray(ln.get_xdata(), float)), g.sort_values("layer").layer)
        assert any(list(ln.get_xdata()) == [2, 2] for ln in ax.get_lines())  # the marked layer
    with pytest.raises(ValueError, match=r"components \['ffn'\]"):
        plots.plot_layer_sweep(df.assign(component="ffn"), tmp_path / "bad.png")


def test_plot_steering(tmp_path, drawn):
    df = pd.DataFrame([{"alpha": a, **repair_rate([False] * 8, [i < r for i in range(8)]).to_dict("rescue"),
                        **breakage_rate([True] * 10, [i >= b for i in range(10)]).to_dict("induction")}
                       for a, r, b in ((8, 8, 9), (2, 3, 1), (4, 5, 4))])
    plots.plot_steering(df, tmp_path / "steer.png")
    ax = drawn["steer.png"].axes[0]
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    df = df.sort_values("alpha")
    np.testing.assert_allclose(np.asarray(bars[0].lines[0].get_ydata(), float), df.rescue)
    np.testing.assert_allclose(np.asarray(bars[1].lines[0].get_ydata(), float), df.induction)
    np.testing.assert_allclose(np.asarray(bars[0].lines[0].get_xdata(), float), df.alpha * 0.97)


# ---------------------------------------------------------------- routing and selection


def routing_curves():
    rows = []
    for model, task, collapsed in (("embedded", "arc_easy", False), ("embedded", "piqa", True)):
        for j, series in enumerate(("random", "mcts", "random vote")):
            value = np.minimum(1, 0.2 + 0.1 * j + 0.05 * np.arange(4))
            rows.append(pd.DataFrame({"model": model, "task": task, "space": "skip", "series": series,
                                      "k": np.arange(1, 5), "value": value, "lo": value - 0.1, "hi": value + 0.1,
                                      "n": 5, "K": 4, "D": 0.3, "collapsed": collapsed,
                                      "format_failure_rate": 0.8 if collapsed else 0.1,
                                      "random_format_failure_rate": 0.9 if collapsed else 0.25}))
    return pd.concat(rows, ignore_index=True)


def test_plot_oracle_curves(tmp_path, drawn):
    curves = routing_curves()
    plots.plot_oracle_curves(curves, "skip", tmp_path / "oracle.png")
    fig = drawn["oracle.png"]
    easy, piqa = fig.axes[:2]
    for ax, task in ((easy, "arc_easy"), (piqa, "piqa")):
        for series in ("random", "mcts", "random vote"):
            g = curves[(curves.task == task) & (curves.series == series)]
            drawn_line = line(ax, plots.SERIES_LABELS[series])
            np.testing.assert_allclose(drawn_line.get_ydata(), g.value)
            bar = next(c for c in ax.containers if isinstance(c, ErrorbarContainer)  # its interval at k = K
                       and c.lines[0].get_color() == drawn_line.get_color())
            segment = bar.lines[2][0].get_segments()[0]
            assert segment[0][0] == drawn_line.get_xdata()[-1]
            assert (segment[0][1], segment[1][1]) == pytest.approx((g.lo.iloc[-1], g.hi.iloc[-1]))
        xs = [tuple(line(ax, plots.SERIES_LABELS[s]).get_xdata()) for s in ("random", "mcts", "random vote")]
        assert len(set(xs)) == 3  # equal values stay visible side by side
        assert line(ax, "deployed D (the full path)").get_ydata()[0] == 0.3
    assert "format collapse (80%)" in piqa.get_title() and "collapse" not in easy.get_title()
    assert "no answer from 25% of random routes" in easy.get_title()
    assert "n = 5, K = 4" in fig._suptitle.get_text()
    with pytest.raises(ValueError, match="no rows for action space 'segments'"):
        plots.plot_oracle_curves(curves, "segments", tmp_path / "x.png")


def test_plot_random_minus_structured(tmp_path, drawn):
    diffs = pd.DataFrame({"space": "skip", "method": ["mcts", "mcts", "genetic"], "diff": [0.25, -0.5, 0.0],
                          "collapsed": [False, True, False], "n": 4, "K": 8, "model": "m",
                          "task": ["squad", "arc_easy", "squad"], "random_format_failure_rate": [0.9, 0.6, 0.9]})
    counts = pd.DataFrame({"space": "skip", "method": ["mcts", "genetic"], "random_better": [1, 0], "tie": [0, 1],
                           "structured_better": [0, 0]})
    plots.plot_random_minus_structured(diffs, counts, tmp_path / "diff.png")
    ax = drawn["diff.png"].axes[0]
    dots = [ln for ln in ax.get_lines() if ln.get_marker() == "o"]
    assert sorted(ln.get_ydata()[0] for ln in dots) == [-50.0, 0.0, 25.0]
    hollow = [ln.get_ydata()[0] for ln in dots if ln.get_markerfacecolor() == "none"]
    assert hollow == [-50.0]
    assert sorted(t.get_text() for t in ax.texts) == ["0 / 1 / 0", "1 / 0 / 0", "arc_easy", "squad", "squad"]
    labelled = {t.get_text(): t.xy[1] for t in ax.texts if t.get_text() in ("arc_easy", "squad") and t.xy[0] < 0.5}
    assert labelled == {"squad": 25.0, "arc_easy": -50.0}  # each name sits at its own cell's dot
    lo, hi = ax.get_xlim()
    assert lo < -0.2 and hi > 1.2  # jittered dots stay inside the axes, away from its edges
    assert "no answer from 80% of random routes (mean)" in ax.get_title()


def test_oracle_curves_legend_names_a_floor_drawn_only_on_a_later_panel(tmp_path, drawn):
    curves = pd.DataFrame({"model": "m", "task": np.repeat(["squad", "arc_easy"], 4), "space": "skip",
                           "series": "random", "k": [1, 2, 4, 8] * 2, "value": 0.5, "lo": 0.4, "hi": 0.6, "n": 30,
                           "K": 8, "D": 0.3, "collapsed": False, "format_failure_rate": 0.0,
                           "guess": [np.nan] * 4 + list(1 - 0.75 ** np.array([1, 2, 4, 8]))})
    plots.plot_oracle_curves(curves, "skip", tmp_path / "oracle.png")
    squad, arc = drawn["oracle.png"].axes[:2]
    assert not any(plots.GUESSER in ln.get_label() for ln in squad.get_lines())
    assert any(plots.GUESSER in t.get_text() for t in arc.get_legend().get_texts())  # one legend, beside the panels


def test_plot_recovery_draws_collapsed_cells_hollow_and_leaves_them_out_of_the_median(tmp_path, drawn):
    rec = pd.DataFrame({"probe": ["routes"] * 3 + ["T0.8"] * 3, "selector": ["majority_vote"] * 6,
                        "recovery": [0.5, -1.0, 2.0, 0.1, 0.3, np.nan], "collapsed": [False, False, True] * 2,
                        "n": 6, "K": 4})
    plots.plot_recovery(rec, [("routes", "routes"), ("T0.8", "samples, T=0.8")], tmp_path / "rec.png")
    ax = drawn["rec.png"].axes[0]
    dots = [ln for ln in ax.get_lines() if ln.get_marker() == "o"]
    filled = sorted(y for ln in dots if ln.get_markerfacecolor() != "none" for y in ln.get_ydata())
    hollow = sorted(y for ln in dots if ln.get_markerfacecolor() == "none" for y in ln.get_ydata())
    assert filled == [-1.0, 0.1, 0.3, 0.5] and hollow == [2.0]  # NaN recovery (oracle = greedy) is not drawn
    medians = sorted(ln.get_ydata()[0] for ln in ax.get_lines() if len(ln.get_xdata()) == 2 and ln.get_linewidth() == 2.5)
    assert medians == pytest.approx([-0.25, 0.2])  # routes: median(0.5, -1.0); the collapsed 2.0 is left out
    assert "n = 6 per cell, K = 4" in ax.get_title()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["routes", "samples, T=0.8", "median over clean cells"]

    # with cells named, each task has its own marker and the legend names it
    named = rec.assign(model="m", task=["squad", "arc_easy", "squad"] * 2)
    plots.plot_recovery(named, [("routes", "routes"), ("T0.8", "samples, T=0.8")], tmp_path / "named.png", title="R, m")
    ax = drawn["named.png"].axes[0]
    shapes = {(ln.get_ydata()[0], ln.get_marker()) for ln in ax.get_lines() if len(ln.get_xdata()) == 1}
    assert shapes == {(0.5, "o"), (-1.0, "s"), (2.0, "o"), (0.1, "o"), (0.3, "s")}
    assert "squad" in [t.get_text() for t in ax.get_legend().get_texts()] and ax.get_title().startswith("R, m: ")


def test_plot_selection_gap(tmp_path, drawn):
    sweep = pd.DataFrame({"model": "m", "task": ["a", "a", "b"], "T": [1.2, 0.4, 0.4], "n": 5, "K": 4,
                          "selection_gap": [0.3, 0.1, 0.2], "selection_gap_lo": 0.0, "selection_gap_hi": 0.5})
    plots.plot_selection_gap(sweep, tmp_path / "gap.png")
    ax = drawn["gap.png"].axes[0]
    a = line(ax, "m / a (n=5)")
    assert list(a.get_xdata()) == [0.4, 1.2] and list(a.get_ydata()) == [0.1, 0.3]
    assert list(line(ax, "m / b (n=5)").get_ydata()) == [0.2]
    assert len([c for c in ax.collections if isinstance(c, PolyCollection)]) == 2


def test_missing_columns_are_named(tmp_path):
    curve = reach_curve(RECS, n_boot=10).drop(columns=["lo"])
    with pytest.raises(ValueError, match=r"reach curve: table lacks columns \['lo'\]"):
        plots.plot_reach_curve(curve, tmp_path / "x.png", "x")
    with pytest.raises(ValueError, match=r"units vs block: table lacks columns \['mass'\]"):
        plots.plot_units_vs_block(pd.DataFrame(columns=["arm", "repair", "repair_k", "repair_n", "repair_vs_block"]),
                                  tmp_path / "y.png")
    with pytest.raises(ValueError, match=r"recovery: table lacks columns \['collapsed'\]"):
        plots.plot_recovery(pd.DataFrame({"probe": ["r"], "selector": ["v"], "recovery": [0.1], "n": [1], "K": [2]}),
                            [("r", "r")], tmp_path / "z.png")


def test_plot_gap_table_draws_each_cell_and_the_guessing_floor(tmp_path, drawn):
    from reach_lens.stats import guessing_floor

    rows = []
    for task, d, v, o, guess in (("arc_easy", 0.2, 0.3, 0.8, guessing_floor([4, 4, 3], 8)),
                                 ("basic_arithmetic", 0.05, 0.05, 0.15, float("nan"))):
        rows.append({"model": "m", "task": task, "n": 3, "K": 8, "T": 0.8, "guess_oracle": guess,
                     **{f"{k}{s}": val + off for k, val in (("deployed", d), ("vote", v), ("oracle", o))
                        for s, off in (("", 0.0), ("_lo", -0.05), ("_hi", 0.05))}})
    df = pd.DataFrame(rows)
    plots.plot_gap_table(df, tmp_path / "t2.png")
    ax = drawn["t2.png"].axes[0]
    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    assert [[round(p.get_height(), 6) for p in b.patches] for b in bars] == [[0.2, 0.05], [0.3, 0.05], [0.8, 0.15]]
    ticks = [ln for ln in ax.get_lines() if ln.get_color() == "black" and len(ln.get_ydata()) == 2]
    assert len(ticks) == 1 and ticks[0].get_ydata()[0] == pytest.approx(rows[0]["guess_oracle"])  # MC only
    assert (guessing_floor([4], 1), guessing_floor([4], 8)) == (0.25, pytest.approx(1 - 0.75 ** 8))
    with pytest.raises(ValueError, match="expected >= 2 options"):
        guessing_floor([1], 8)


def _floor_lines(fig):
    return [ln for ax in fig.axes for ln in ax.get_lines() if plots.GUESSER in ln.get_label()]


def test_multiple_choice_oracle_figures_draw_the_guessers_floor_and_free_form_ones_none(tmp_path, drawn):
    from reach_lens.audit import temperature_sweep
    from reach_lens.stats import guessing_floor

    options = [4, 4, 3, 4, 4, 4, 4, 4]  # eight multiple-choice questions; free-form ones have no options
    for kind, counts in (("mc", options), ("free", None)):
        curve = reach_curve(RECS)
        curve["guess"] = guessing_floor(counts, curve["k"])
        plots.plot_reach_curve(curve, tmp_path / f"reach_{kind}.png", title=kind, deployed=0.3, vote=0.4)
        sweep = temperature_sweep({0.4: RECS, 0.8: RECS}).assign(
            guess_D=guessing_floor(counts, 1), guess_O=guessing_floor(counts, 8), model="m", task=kind)
        plots.plot_temperature_gap(sweep, tmp_path / f"temperature_{kind}.png")
        plots.plot_selection_gap(sweep, tmp_path / f"gap_{kind}.png")
        curves = pd.DataFrame({"model": "m", "task": kind, "space": "skip", "series": "random", "k": [1, 2, 4, 8],
                               "value": [0.3, 0.5, 0.6, 0.7], "lo": 0.2, "hi": 0.8, "n": 8, "K": 8, "D": 0.3,
                               "collapsed": False, "format_failure_rate": 0.0})
        curves["guess"] = guessing_floor(counts, curves["k"])
        plots.plot_oracle_curves(curves, "skip", tmp_path / f"oracle_{kind}.png")
    for name in ("reach", "temperature", "gap", "oracle"):
        assert not _floor_lines(drawn[f"{name}_free.png"]), name
    (reach,) = _floor_lines(drawn["reach_mc.png"])
    np.testing.assert_allclose(reach.get_ydata(), guessing_floor(options, np.arange(1, 9)))
    assert reach.get_ydata()[-1] == pytest.approx(np.mean([1 - 0.75 ** 8] * 7 + [1 - (2 / 3) ** 8]))
    oracle_floor, gap_floor = _floor_lines(drawn["temperature_mc.png"])
    assert oracle_floor.get_ydata()[0] == pytest.approx(guessing_floor(options, 8))
    assert gap_floor.get_ydata()[0] == pytest.approx(guessing_floor(options, 8) - guessing_floor(options, 1))
    (gap,) = _floor_lines(drawn["gap_mc.png"])
    assert gap.get_ydata()[0] == pytest.approx(guessing_floor(options, 8) - np.mean([1 / m for m in options]))
    (routes,) = _floor_lines(drawn["oracle_mc.png"])
    np.testing.assert_allclose(routes.get_ydata(), guessing_floor(options, [1, 2, 4, 8]))


def test_plot_functions_return_the_figure_and_save_only_when_given_a_path(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    monkeypatch.chdir(tmp_path)
    fig = plots.plot_reach_curve(reach_curve(RECS), title="in a notebook")
    assert isinstance(fig, Figure) and not list(tmp_path.iterdir())  # nothing written
    saved = plots.plot_reach_curve(reach_curve(RECS), tmp_path / "out" / "reach.png", title="to a file")
    assert isinstance(saved, Figure) and (tmp_path / "out" / "reach.png").read_bytes()[:8] == PNG_MAGIC
    assert plots.save(fig, tmp_path / "later.png") == tmp_path / "later.png"
