import pandas as pd
import pytest

from reach_lens.audit import breakage_rate, reach_curve, repair_rate, summarize
from reach_lens.records import make_record
from reach_lens.select import majority_vote
from reach_lens.plots import (plot_census, plot_layer_sweep, plot_reach_curve, plot_steering, plot_temperature_gap,
                              plot_units)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _is_png(path) -> bool:
    data = path.read_bytes()
    return data[:8] == PNG_MAGIC and len(data) > 5000  # a rendered figure, not an empty canvas


def _records(hits, d, K=8):
    cands = [[{"text": "", "answer": "g" if k < h else "w", "correct": k < h, "mean_logprob": -1.0, "length": 5}
              for k in range(K)] for h in hits]
    return pd.DataFrame([make_record(i, "g", {"text": "", "answer": "g" if di else "w", "correct": bool(di)},
                                     cs, majority_vote(cs))
                         for i, (cs, di) in enumerate(zip(cands, d))])


RECS = _records([0, 1, 3, 8, 0, 2, 5, 0], [0, 0, 1, 1, 0, 0, 1, 0])


def test_plot_reach_curve(tmp_path):
    curve = reach_curve(RECS, n_boot=100)
    s = summarize(RECS, n_boot=100)
    out = plot_reach_curve(curve, tmp_path / "reach.png", "toy", deployed=s["D"], vote=s["vote"])
    assert out == tmp_path / "reach.png" and _is_png(out)
    two = pd.concat([curve.assign(series="random"), reach_curve(_records([1] * 8, [0] * 8), n_boot=100)
                    .assign(series="mcts")])
    assert _is_png(plot_reach_curve(two, tmp_path / "sub" / "two.png", "two series"))


def test_plot_temperature_gap(tmp_path):
    df = pd.DataFrame([{"T": T, **summarize(_records(h, d), n_boot=100)}
                       for T, h, d in ((0.2, [0, 1, 8, 8], [0, 0, 1, 1]), (0.8, [0, 3, 5, 8], [0, 0, 1, 1]),
                                       (1.2, [2, 3, 5, 6], [0, 0, 1, 1]))])
    assert _is_png(plot_temperature_gap(df, tmp_path / "t.png"))


def test_plot_census(tmp_path):
    df = pd.DataFrame({"cell": ["a", "b", "c"], "recognition_acc": [0.5, 0.7, 0.3],
                       "generation_acc": [0.3, 0.7, 0.35], "n_fail": [8, 1, 0], "meets_criterion": [True, False, False]})
    assert _is_png(plot_census(df, tmp_path / "census.png"))


def test_plot_layer_sweep(tmp_path):
    rows = []
    for layer in range(4):
        for j, comp in enumerate(("mlp", "attn", "layer")):
            rep = repair_rate([False] * 8, [i < (2 * layer + j) % 9 for i in range(8)])
            brk = breakage_rate([True] * 10, [i >= layer + 2 * j for i in range(10)])
            rows.append({"layer": layer, "component": comp, **rep.to_dict("repair"), **brk.to_dict("breakage")})
    assert _is_png(plot_layer_sweep(pd.DataFrame(rows), tmp_path / "sweep.png", marked_layer=2))
    with pytest.raises(ValueError, match=r"components \['ffn'\]"):
        plot_layer_sweep(pd.DataFrame(rows).assign(component="ffn"), tmp_path / "bad.png")


def test_plot_steering(tmp_path):
    df = pd.DataFrame([{"alpha": a, **repair_rate([False] * 8, [i < r for i in range(8)]).to_dict("rescue"),
                        **breakage_rate([True] * 10, [i >= b for i in range(10)]).to_dict("induction")}
                       for a, r, b in ((2, 3, 1), (4, 5, 4), (8, 8, 9))])
    assert _is_png(plot_steering(df, tmp_path / "steer.png"))


def test_plot_units(tmp_path):
    rows = [{"case": case, "arm": arm, **repair_rate([False] * n, [i < k for i in range(n)]).to_dict("repair")}
            for case, n in (("smol/arc-e", 8), ("smol/arc-c", 5))
            for arm, k in (("block", n - 1), ("top", n - 2), ("random", 1))]
    assert _is_png(plot_units(pd.DataFrame(rows), tmp_path / "units.png"))


def test_missing_columns_are_named(tmp_path):
    curve = reach_curve(RECS, n_boot=10).drop(columns=["lo"])
    with pytest.raises(ValueError, match=r"reach curve: table lacks columns \['lo'\]"):
        plot_reach_curve(curve, tmp_path / "x.png", "x")
    with pytest.raises(ValueError, match="empty"):
        plot_units(pd.DataFrame(columns=["case", "arm", "repair", "repair_lo", "repair_hi", "repair_n"]),
                   tmp_path / "y.png")
