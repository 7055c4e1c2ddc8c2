"""The census criterion (`census.census_cell`, `census.meets_criterion`) on hand-made screens: both branches."""
import pandas as pd
import pytest

from reach_lens.census import census_cell, meets_criterion
from reach_lens.stats import wilson_interval, wilson_rate


def screen(recognized: int, generated: int, fail: int, n: int, unparsed: int = 0) -> pd.DataFrame:
    """n questions: `fail` recognized-not-generated, the other recognized ones also generated, `generated` in all."""
    both = recognized - fail
    assert 0 <= both <= generated <= n - fail
    rec = [True] * recognized + [False] * (n - recognized)
    gen = [False] * fail + [True] * both + [True] * (generated - both) + [False] * (n - fail - generated)
    return pd.DataFrame({"question_id": [f"q{i}" for i in range(n)], "recognized": rec, "generated": gen,
                         "gen_format_ok": [i >= unparsed for i in range(n)]})


def test_a_cell_with_disjoint_intervals_and_enough_failures_meets_the_criterion():
    cell = census_cell(screen(recognized=30, generated=8, fail=24, n=40, unparsed=4), min_failures=5)
    assert (cell["n"], cell["n_fail"], cell["n_healthy"]) == (40, 24, 6)
    assert (cell["recognition_acc"], cell["generation_acc"]) == (0.75, 0.2)
    assert (cell["recognition_lo"], cell["recognition_hi"]) == pytest.approx(wilson_interval(30, 40))
    assert (cell["generation_lo"], cell["generation_hi"]) == pytest.approx(wilson_interval(8, 40))
    assert cell["recognition_lo"] > cell["generation_hi"]
    assert cell["format_failure_rate"] == pytest.approx(0.1)
    assert cell["meets_criterion"] is True


def test_overlapping_intervals_fail_the_criterion_whatever_the_failure_count():
    cell = census_cell(screen(recognized=12, generated=9, fail=10, n=30), min_failures=5)
    assert cell["n_fail"] == 10 and cell["recognition_acc"] > cell["generation_acc"]
    assert cell["recognition_lo"] <= cell["generation_hi"]
    assert cell["meets_criterion"] is False


def test_too_few_failures_fail_the_criterion_even_with_disjoint_intervals():
    s = screen(recognized=30, generated=8, fail=24, n=40)
    assert census_cell(s, min_failures=24)["meets_criterion"] is True
    assert census_cell(s, min_failures=25)["meets_criterion"] is False


def test_meets_criterion_compares_the_interval_bounds():
    rec, gen = wilson_rate(30, 40), wilson_rate(8, 40)
    assert meets_criterion(rec, gen, n_fail=5, min_failures=5)
    assert not meets_criterion(gen, rec, n_fail=5, min_failures=5)  # generation above recognition
    assert not meets_criterion(wilson_rate(20, 40), wilson_rate(12, 40), n_fail=9, min_failures=5)  # 0.5 vs 0.3 overlap at n=40


def test_census_cell_needs_the_screen_columns():
    with pytest.raises(ValueError, match=r"screen lack columns \['gen_format_ok'\]"):
        census_cell(pd.DataFrame({"recognized": [True], "generated": [False]}), min_failures=1)
