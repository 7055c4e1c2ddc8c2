"""The census criterion: one (checkpoint, task) cell's recognition and generation accuracies from its screen,
and whether it holds a failure set large enough for the localization study."""
import pandas as pd

from reach_lens.audit import require_columns
from reach_lens.stats import Rate, wilson_rate


def census_cell(screened: pd.DataFrame, min_failures: int) -> dict:
    """One census cell from its screen (columns recognized, generated, gen_format_ok; one row per question).

    n; recognition_acc and generation_acc with Wilson 95% bounds (_lo, _hi); format_failure_rate (greedy
    answers with no extractable answer); n_fail (recognized, not generated) and n_healthy (both); and
    meets_criterion (`meets_criterion`).
    """
    require_columns(screened, ("recognized", "generated", "gen_format_ok"), "screen")
    n = len(screened)
    recognized, generated = screened["recognized"].astype(bool), screened["generated"].astype(bool)
    rec, gen = wilson_rate(int(recognized.sum()), n), wilson_rate(int(generated.sum()), n)
    n_fail = int((recognized & ~generated).sum())
    return {"n": n, "recognition_acc": rec.rate, "recognition_lo": rec.lo, "recognition_hi": rec.hi,
            "generation_acc": gen.rate, "generation_lo": gen.lo, "generation_hi": gen.hi,
            "format_failure_rate": 1.0 - float(screened["gen_format_ok"].astype(bool).mean()),
            "n_fail": n_fail, "n_healthy": int((recognized & generated).sum()),
            "meets_criterion": meets_criterion(rec, gen, n_fail, min_failures)}


def meets_criterion(recognition: Rate, generation: Rate, n_fail: int, min_failures: int) -> bool:
    """The census criterion: recognition accuracy above generation accuracy with disjoint 95% Wilson intervals
    (recognition's lower bound above generation's upper bound), and at least ``min_failures`` questions
    recognized but not generated (a failure set large enough for the localization study)."""
    return bool(recognition.lo > generation.hi and n_fail >= min_failures)
