"""The paired comparison of two 0/1 outcomes on the same questions: Newcombe's interval, the exact McNemar test
and the words generated from it."""
import itertools
import math

import numpy as np
import pytest

from reach_lens import stats


def table(both: int, a_only: int, b_only: int, neither: int) -> tuple[np.ndarray, np.ndarray]:
    """Paired outcomes a, b with the given 2x2 counts."""
    a = np.array([1] * both + [1] * a_only + [0] * b_only + [0] * neither, dtype=bool)
    b = np.array([1] * both + [0] * a_only + [1] * b_only + [0] * neither, dtype=bool)
    return a, b


def test_newcombe_interval_matches_the_published_square_and_add_value():
    # Cavo et al. (2012) paired 2x2 table [[59, 6], [16, 80]]: Newcombe's square-and-add interval for
    # p1+ - p+1 is -0.0621 (-0.1186 to -0.0046) (R package contingencytables, chapter 8 tests)
    m = stats.paired_comparison(*table(59, 6, 16, 80))
    assert m["diff"] == pytest.approx(-0.0621, abs=5e-5)
    assert m["lo"] == pytest.approx(-0.1186, abs=5e-5) and m["hi"] == pytest.approx(-0.0046, abs=5e-5)
    assert (m["n"], m["a_only"], m["b_only"], m["both"], m["neither"]) == (161, 6, 16, 59, 80)


def test_routing_squad_cell_12_vs_4_discordant():
    # routing SQuAD n = 100: 12 questions only random reaches, 4 only MCTS, 21 both, 63 neither
    m = stats.paired_comparison(*table(21, 12, 4, 63))
    assert m["diff"] == pytest.approx(0.08)
    assert m["p"] == pytest.approx(0.076812744140625, rel=1e-12)  # 2 * P(Bin(16, 1/2) <= 4) = 2 * 2517 / 65536
    assert 100 * m["lo"] == pytest.approx(0.04, abs=0.005) and 100 * m["hi"] == pytest.approx(15.9, abs=0.05)
    # a documented disagreement: the interval just excludes 0 while the exact test does not reject at 0.05
    assert m["lo"] > 0 and m["p"] > 0.05
    words = stats.paired_verdict(m, names=("random", "MCTS"))
    assert words == "random − MCTS = +8.0 pp [+0.0, +15.9] (12 vs 4 discordant): not significant at 0.05 (p = 0.077)"
    # the interval excludes 0 yet the verdict is the test's: a tie for every study's rule
    assert stats.paired_direction(m) == "tie"


def test_swapping_a_and_b_negates_the_difference_swaps_the_bounds_and_keeps_p():
    rng = np.random.default_rng(0)
    for _ in range(50):
        n = int(rng.integers(1, 40))
        a, b = rng.random(n) < rng.random(), rng.random(n) < rng.random()
        ab, ba = stats.paired_comparison(a, b), stats.paired_comparison(b, a)
        assert ba["diff"] == pytest.approx(-ab["diff"])
        assert ba["lo"] == pytest.approx(-ab["hi"]) and ba["hi"] == pytest.approx(-ab["lo"])
        assert ba["p"] == ab["p"] and (ba["a_only"], ba["b_only"]) == (ab["b_only"], ab["a_only"])
        assert ab["lo"] <= ab["diff"] <= ab["hi"] and 0 < ab["p"] <= 1


def test_identical_outcomes_are_a_tie():
    for a in (np.ones(10, bool), np.zeros(7, bool), np.array([1, 0, 1, 1, 0], bool)):
        m = stats.paired_comparison(a, a)
        assert m["diff"] == 0 and m["p"] == 1 and m["a_only"] == m["b_only"] == 0
        assert m["lo"] <= 0 <= m["hi"]
    assert "not significant at 0.05" in stats.paired_verdict(stats.paired_comparison(a, a))


def test_interval_edges():
    all_vs_none = stats.paired_comparison(np.ones(12, bool), np.zeros(12, bool))
    assert all_vs_none["diff"] == 1 and 0.5 < all_vs_none["lo"] < 1 and all_vs_none["hi"] == 1
    assert all_vs_none["p"] == pytest.approx(2 / 2 ** 12)
    one_more = stats.paired_comparison(np.array([1, 0, 0, 0, 0, 0, 0, 0], bool), np.zeros(8, bool))
    assert one_more["diff"] == pytest.approx(1 / 8) and one_more["lo"] < 0 and one_more["p"] == 1
    with pytest.raises(ValueError, match="one length"):
        stats.paired_comparison(np.ones(3, bool), np.ones(4, bool))
    with pytest.raises(ValueError, match="non-empty"):
        stats.paired_comparison(np.ones(0, bool), np.ones(0, bool))


def test_mcnemar_p_equals_brute_force_enumeration():
    # the exact two-sided p: the probability, under fair coin flips of the m discordant pairs, of a split at
    # least as unbalanced as the observed one, enumerated over all 2^m outcomes
    for m in range(0, 11):
        for a_only in range(m + 1):
            far = abs(a_only - m / 2)
            brute = sum(abs(sum(flips) - m / 2) >= far - 1e-9 for flips in itertools.product((0, 1), repeat=m)) / 2 ** m
            assert stats.mcnemar_p(a_only, m - a_only) == pytest.approx(brute, abs=1e-12), (a_only, m)
    with pytest.raises(ValueError):
        stats.mcnemar_p(-1, 3)


def test_significance_at_005_needs_enough_discordant_pairs():
    # with all m discordant pairs on one side, p = 2 / 2^m: below 0.05 exactly when m >= 6
    assert [stats.mcnemar_p(m, 0) < 0.05 for m in range(1, 8)] == [False] * 5 + [True] * 2
    # at m = 16 the split must be 13 vs 3 or further (p = 0.021); 12 vs 4 gives 0.077
    assert [round(stats.mcnemar_p(k, 16 - k), 3) for k in (12, 13)] == [0.077, 0.021]
    # the concordant questions do not move the test (they move the interval)
    assert stats.paired_comparison(*table(0, 13, 3, 0))["p"] == stats.paired_comparison(*table(50, 13, 3, 200))["p"]


def test_words_name_the_higher_side_only_when_significant():
    m = stats.paired_comparison(*table(10, 3, 13, 74))
    words = stats.paired_verdict(m, names=("trained", "base"))
    assert words.startswith("trained − base = -10.0 pp [") and words.endswith(
        "(3 vs 13 discordant): base higher, significant at 0.05 (p = 0.021)")
    assert stats.paired_direction(m) == "b" and stats.paired_direction(m, alpha=0.01) == "tie"
    assert stats.paired_verdict(m, alpha=0.01).endswith("not significant at 0.01 (p = 0.021)")
    assert stats.format_p(1e-5) == "< 0.001" and stats.format_p(0.0768) == "0.077"
    assert math.isclose(stats.mcnemar_p(13, 3), 2 * sum(math.comb(16, i) for i in range(4)) / 2 ** 16)
