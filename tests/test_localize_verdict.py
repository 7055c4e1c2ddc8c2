"""Runner-ups, paired margins and the verdict of the MLP study, on hand-made sweeps and outcomes."""
import numpy as np
import pandas as pd
import pytest

from reach_lens import localize


def sweep_of(rows) -> pd.DataFrame:
    """(component, layer, repair, breakage) tuples as a sweep table."""
    return pd.DataFrame(rows, columns=["component", "layer", "repair", "breakage"])


def outcomes(bits: str, prefix: str = "q") -> pd.Series:
    return pd.Series([b == "1" for b in bits], index=[f"{prefix}{i}" for i in range(len(bits))])


def test_runner_ups_exclude_the_block_and_its_whole_layer_and_name_the_best_other_mlp():
    sweep = sweep_of([("mlp", 5, 0.9, 0.0), ("layer", 5, 1.0, 0.0), ("attn", 5, 0.2, 0.0), ("attn", 7, 0.8, 0.1),
                      ("attn", 2, 0.6, 0.0), ("mlp", 3, 0.5, 0.4), ("mlp", 8, 0.3, 0.0), ("attn", 9, 0.6, 0.0)])
    assert localize.identify_layer(sweep, "net") == 5
    net = localize.runner_ups(sweep, 5, "net", top=2)
    assert list(zip(net.component, net.layer)) == [("attn", 7), ("attn", 2), ("mlp", 8)]  # ties: lower layer first
    assert list(net.label) == ["best component", "runner-up 2", "best other MLP"]
    repair = localize.runner_ups(sweep, 5, "repair", top=1)  # the paper's rule ranks by repair alone
    assert list(zip(repair.component, repair.layer, repair.label)) == [("attn", 7, "best component"),
                                                                        ("mlp", 3, "best other MLP")]
    both = localize.runner_ups(sweep_of([("mlp", 1, 0.9, 0), ("mlp", 2, 0.8, 0), ("attn", 2, 0.1, 0)]), 1, top=1)
    assert list(both.label) == ["best component, best other MLP"]
    with pytest.raises(ValueError, match="nothing to compare"):
        localize.runner_ups(sweep_of([("mlp", 1, 0.9, 0), ("layer", 1, 0.9, 0)]), 1)


def test_margins_are_paired_over_the_same_failures():
    identified = outcomes("1111111111110000")
    table = localize.margins(identified, {"attention 7": outcomes("0000000000000000"),
                                          "MLP 8": outcomes("1111111111110000"),
                                          "MLP 3": outcomes("1111111111111111")})
    by = table.set_index("name")
    assert by.loc["attention 7", "diff"] == pytest.approx(0.75) and by.loc["attention 7", "lo"] > 0
    assert by.loc["MLP 8", "diff"] == 0 and by.loc["MLP 8", "lo"] < 0 < by.loc["MLP 8", "hi"]
    assert (by.loc["MLP 3", "a_only"], by.loc["MLP 3", "b_only"]) == (0, 4) and by.loc["MLP 3", "hi"] < 0.05
    assert by.loc["attention 7", "p"] == pytest.approx(2 / 2 ** 12) and by.loc["MLP 8", "p"] == 1  # exact McNemar
    assert by.loc["MLP 3", "p"] == pytest.approx(0.125)  # 0 vs 4 discordant: the interval excludes 0, the test does not
    shuffled = outcomes("1111111111110000").iloc[::-1]  # the same outcomes in another order pair by question id
    assert localize.margins(identified, {"x": shuffled}).iloc[0]["diff"] == 0
    with pytest.raises(ValueError, match="paired"):
        localize.margins(identified, {"other questions": outcomes("1111", prefix="z")})


RATES = {"repair": 0.9, "repair_lo": 0.75, "repair_hi": 0.97, "breakage": 0.0, "breakage_lo": 0.0, "breakage_hi": 0.1}


def test_verdict_claims_a_locus_only_above_every_runner_up():
    identified = outcomes("1" * 20)
    clear = localize.margins(identified, {"attention 7": outcomes("0" * 20), "MLP 8": outcomes("1" * 4 + "0" * 16)})
    v = localize.verdict("MLP 5", RATES, clear)
    assert v["locus"] and not v["ties"] and "MLP 5 is a locus" in v["text"]

    tie = localize.margins(identified, {"attention 7": outcomes("0" * 20), "MLP 8": outcomes("1" * 19 + "0")})
    v = localize.verdict("MLP 5", RATES, tie)
    assert not v["locus"] and v["ties"] == ["MLP 8"]
    assert v["text"].startswith("No locus claimed for MLP 5: MLP 8 ties with it: not significant at 0.05 (p = 1.000)")

    # 4 vs 0 discordant: Newcombe's interval excludes 0 but the exact test (p = 0.125) does not reject; the verdict
    # is the test's, as in every study
    edge = localize.margins(outcomes("1" * 16), {"MLP 9": outcomes("1" * 12 + "0" * 4)})
    assert edge.iloc[0]["lo"] > 0 and edge.iloc[0]["p"] == pytest.approx(0.125)
    v = localize.verdict("MLP 5", RATES, edge)
    assert not v["locus"] and v["ties"] == ["MLP 9"]

    beaten = localize.margins(outcomes("0" * 20), {"attention 7": outcomes("1" * 20)})
    v = localize.verdict("MLP 5", RATES, beaten)
    assert not v["locus"] and v["beaten_by"] == ["attention 7"]
    assert "attention 7 higher, significant at 0.05 (p < 0.001)" in v["text"]

    breaks_everything = {**RATES, "breakage": 1.0, "breakage_lo": 0.8, "breakage_hi": 1.0}
    v = localize.verdict("MLP 5", breaks_everything, clear)
    assert not v["locus"] and not v["selective"] and "breakage" in v["text"]
