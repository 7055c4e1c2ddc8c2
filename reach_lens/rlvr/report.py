"""The RLVR study's tables as the markdown of its ``summary.md``: intervals beside every rate, each multiple-choice
oracle beside the uniform guesser's floor.

    text = report(t5, fates, t6, t7, t8, prop, K=4, T=0.8, fmt="native", control_fmt="shared", crossings=cross,
                  differences=diffs, narrowing=narrow)
"""
from __future__ import annotations

import pandas as pd

from reach_lens.stats import p_text


def markdown(df: pd.DataFrame) -> str:
    """A DataFrame as a markdown table (floats to 3 decimals)."""
    cells = [[f"{v:.3f}" if isinstance(v, float) else str(v) for v in row] for row in df.itertuples(index=False)]
    return "\n".join(["| " + " | ".join(map(str, df.columns)) + " |", "|" + "---|" * len(df.columns),
                      *("| " + " | ".join(row) + " |" for row in cells)])


def _pct(row, m: str) -> str:
    if pd.isna(row[m]):
        return "n/a (n = 0)"
    return f"{row[m]:.1%} [{row[f'{m}_lo']:.1%}, {row[f'{m}_hi']:.1%}]"


def _ratio(row) -> str:
    return "n/a" if pd.isna(row.retained) else f"{row.retained:.2f} [{row.retained_lo:.2f}, {row.retained_hi:.2f}]"


def _floor(value: float) -> str:
    """A guessing floor, or "none" for free-form answers (NaN)."""
    return "none (free-form)" if pd.isna(value) else f"{value:.1%}"


def _pp(row: pd.Series, m: str) -> str:
    """A difference in pp with its interval, and its exact paired p (and, for a change, the questions only the
    trained / only the base side gets) beside it when the row has them."""
    text = f"{100 * row[m]:+.1f} pp [{100 * row[f'{m}_lo']:+.1f}, {100 * row[f'{m}_hi']:+.1f}]"
    if pd.notna(row.get(f"{m}_p")):
        text += f", {p_text(row[f'{m}_p'])}"
    if pd.notna(row.get(f"{m}_gained")):
        text += f" ({int(row[f'{m}_gained'])} vs {int(row[f'{m}_lost'])})"
    return text


def _crossing(r) -> str:
    """One lineage's reach@k crossover (a `tables.crossovers` row over all 2K samples, its K) in words."""
    if not pd.isna(r.k_cross) and r.k_cross == 1:
        return f"the base's reach@k is at or above the trained one's from k = 1 (of 2K = {int(r.K)} samples)"
    if not pd.isna(r.k_cross):
        return f"the base's reach@k overtakes at k = {int(r.k_cross)} (of 2K = {int(r.K)} samples)"
    text = (f"no crossover up to 2K = {int(r.K)} samples; smallest gap trained − base {100 * r.min_gap:+.1f} pp "
            f"[{100 * r.min_gap_lo:+.1f}, {100 * r.min_gap_hi:+.1f}] at k = {int(r.k_min_gap)}")
    return text + (f"; gap at k = {int(r.K)}: {100 * r.gap_K:+.1f} pp [{100 * r.gap_K_lo:+.1f}, "
                   f"{100 * r.gap_K_hi:+.1f}]")


def narrowing_words(r) -> str:
    """A `tables.reach_leads` narrowing row in words, its verdict from the computed interval: e.g. "the lead of grpo
    over base (trained − base reach@k) at its peak (k = 12, +10.0 pp) minus at k = 128 (+6.0 pp): +4.0 pp [+1.2,
    +6.9], narrows", or "...: no narrowing shown" (with "grpo is never ahead" when its lead is never positive)."""
    never_ahead = "" if r.lead_peak > 0 else f" ({r.pair} is never ahead)"
    verdict = "narrows" if r.narrows else f"no narrowing shown{never_ahead}"
    return (f"the lead of {r.pair} over {r.base} (trained − base reach@k) at its peak (k = {int(r.k_peak)}, "
            f"{100 * r.lead_peak:+.1f} pp) minus at k = {int(r.samples)} ({100 * r.lead_last:+.1f} pp): "
            f"{100 * r.narrowing:+.1f} pp [{100 * r.narrowing_lo:+.1f}, {100 * r.narrowing_hi:+.1f}], {verdict}")


def _nulls(r) -> str:
    """A `tables.fates_table` row's gains from base-reachable questions against both nulls."""
    text = (f"gains from base-reachable questions {r.gains_from_reachable} against "
            f"{r.gains_from_reachable_expected:.1f} [{r.gains_from_reachable_expected_lo:.0f}, "
            f"{r.gains_from_reachable_expected_hi:.0f}] if gaining ignored base reachability (independence)")
    if "gains_from_reachable_expected_resampling" in r.index:
        text += (f" and {r.gains_from_reachable_expected_resampling:.1f} "
                 f"[{r.gains_from_reachable_expected_resampling_lo:.0f}, "
                 f"{r.gains_from_reachable_expected_resampling_hi:.0f}] if the trained greedy answer were one of "
                 f"the base's samples (resampling, base hit rate over {int(r.resampling_samples)} samples); from "
                 f"base-unreachable {r.gains_from_unreachable}, resampling expects "
                 f"{r.gains_from_unreachable_expected_resampling:.1f}")
    return text


def lineages(fates, crossings=None, narrowing=None) -> list[str]:
    """Per lineage, one line: its reach@k crossover (``crossings``: `tables.crossovers`), whether its lead narrows
    after its peak (``narrowing``: `tables.reach_leads`' second table) and its gains from base-reachable questions
    against both nulls (`tables.fates_table`)."""
    cross = {} if crossings is None else {r.pair: _crossing(r) for _, r in crossings.iterrows()}
    narrow = {} if narrowing is None else {r.pair: narrowing_words(r) for _, r in narrowing.iterrows()}
    return [f"- **{r.pair}**: " + "; ".join([c[r.pair] for c in (cross, narrow) if r.pair in c] + [_nulls(r)]) + "."
            for _, r in fates.iterrows()]


def _differences(differences, narrowing, K: int) -> list[str]:
    """The base − trained reach@k section: per pair, the difference at k = 1, K, the lead's peak and 2K with its
    pointwise band (`tables.reach_leads`)."""
    first = differences.iloc[0]
    lines = ["", f"## reach@k, base − trained (k = 1..2K = {2 * K}, unbiased pass@k from all {2 * K} samples of each "
             f"question; pointwise 95% band from {int(first.n_boot)} paired question resamples, seed "
             f"{int(first.seed)})", "", f"| pair | k = 1 | k = K = {K} | peak of the trained lead | k = 2K = {2 * K} |",
             "|---|---|---|---|---|"]
    peaks = narrowing.set_index("pair")["k_peak"]
    for pair, g in differences.groupby("pair", sort=False):
        at = g.set_index("k")
        cells = [f"{100 * at.base_minus_trained[k]:+.1f} pp [{100 * at.base_minus_trained_lo[k]:+.1f}, "
                 f"{100 * at.base_minus_trained_hi[k]:+.1f}]" for k in (1, K, int(peaks[pair]), 2 * K)]
        cells[2] = f"k = {int(peaks[pair])}: {cells[2]}"
        lines.append(f"| {pair} | " + " | ".join(cells) + " |")
    return lines


def report(t5, fates, t6, t7, t8, prop, K: int, T: float, fmt: str, control_fmt: str, reference: str = "",
           crossings=None, differences=None, narrowing=None) -> str:
    """The tables (``reach_lens.rlvr.tables``) as markdown, every oracle beside its guessing floor: ``t5``
    `tables.checkpoint_changes`, ``fates`` `tables.fates_table`, ``t6`` `tables.checkpoint_changes_by_budget`, ``t7``
    `tables.deployed_vote_oracle`, ``t8`` `tables.format_transfer` (None: no control format, no Table 8), ``prop``
    `tables.propensity` (the paper's
    Tables 5-8, Figures 6a and 7); ``reference`` (the paper's figures to read them against) follows Table 5;
    ``crossings`` (`tables.crossovers`) adds each lineage's reach@k crossover to the per-lineage lines after
    Figure 6a, ``narrowing`` whether its lead narrows after its peak, and ``differences`` (both from
    `tables.reach_leads`) a section of base − trained reach@k with its band."""
    lines = [f"## Table 5 (n = {int(t5['n'].iloc[0])}, K = {K}, T = {T:g}, {fmt} format; Wilson 95%, changes trained − base "
             "by Newcombe's paired 95% interval, the exact McNemar p and the questions only trained vs only base "
             "gets)", "", "| pair | base D | base O_K | trained D | trained O_K | floor | ΔD | ΔO | Δn_reachable |", "|---|---|---|---|---|---|---|---|---|"]
    for _, r in t5.iterrows():
        lines.append(f"| {r.pair} | {_pct(r, 'D_base')} | {_pct(r, 'O_base')} | {_pct(r, 'D_trained')} | "
                     f"{_pct(r, 'O_trained')} | {_floor(r.floor)} | {_pp(r, 'D_change')} | {_pp(r, 'O_change')} | "
                     f"{r.delta_n_reachable:+d} [{r.delta_n_reachable_lo:+.0f}, {r.delta_n_reachable_hi:+.0f}] |")
    lines += ["", reference, "", "## Figure 6a: fates (counts of questions)", "",
              "Gains from base-reachable questions beside what independence would give (gains spread over the "
              "base-unrealized questions regardless of base reachability; 95% permutation interval):", "",
              "| pair | gains | from base-reachable | expected if independent | from base-unreachable | losses | "
              "entered reachable | left reachable |", "|---|---|---|---|---|---|---|---|"]
    for _, r in fates.iterrows():
        gains = r.gains_from_reachable + r.gains_from_unreachable
        lines.append(f"| {r.pair} | {gains} | {r.gains_from_reachable} | {r.gains_from_reachable_expected:.1f} "
                     f"[{r.gains_from_reachable_expected_lo:.0f}, {r.gains_from_reachable_expected_hi:.0f}] | "
                     f"{r.gains_from_unreachable} | {r.losses} | {r.entered_reachable} | {r.left_reachable} |")
    lines += ["", "Per lineage: reach@k over all samples (unbiased pass@k; the smallest gap with its paired "
              "question-bootstrap 95% interval), and gains from base-reachable questions against two nulls "
              "(independence: 95% permutation interval; resampling: question i gained with probability its base "
              "hit rate, 95% exact Poisson-binomial interval):", "", *lineages(fates, crossings, narrowing)]
    if narrowing is not None and len(narrowing):
        first = narrowing.iloc[0]
        lines += ["", f"Narrowing: the trained lead (trained − base reach@k, all {2 * K} samples) at its peak k "
                  f"minus at k = {2 * K}, with its basic bootstrap 95% interval over {int(first.n_boot)} paired "
                  f"question resamples (seed {int(first.seed)}), the peak chosen again in each; \"narrows\" only where "
                  "that interval excludes 0."]
    if differences is not None and narrowing is not None and len(differences):
        lines += _differences(differences, narrowing, K)
    lines += ["", f"## Table 6: budget control (K and 2K from one set of {2 * K} samples)", "",
              "| pair | K | floor | base O | trained O | O_base − O_trained | base O−D | trained O−D | Δn_reachable | "
              "base / trained reach@k at this k, unbiased from all 2K samples (O: from the first k) |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for _, r in t6.iterrows():
        lines.append(f"| {r.pair} | {r.K} | {_floor(r.floor)} | {_pct(r, 'O_base')} | {_pct(r, 'O_trained')} | "
                     f"{_pp(r, 'O_drop')} | {100 * r.gap_base:+.1f} pp | {100 * r.gap_trained:+.1f} pp | "
                     f"{r.delta_n_reachable:+d} [{r.delta_n_reachable_lo:+.0f}, {r.delta_n_reachable_hi:+.0f}] | "
                     f"{r.reach_base_unbiased:.1%} / {r.reach_trained_unbiased:.1%} |")
    lines += ["", f"## Table 7: lineage (K = {K})", "", "| checkpoint | deployed D | vote@K | oracle O_K | floor | "
              f"O_{2 * K} | floor {2 * K} |", "|---|---|---|---|---|---|---|"]
    for _, r in t7.iterrows():
        lines.append(f"| {r.checkpoint} | {_pct(r, 'D')} | {_pct(r, 'vote')} | {_pct(r, 'O')} | {_floor(r.floor)} | "
                     f"{_pct(r, 'O_all')} | {_floor(r.floor_all)} |")
    if t8 is not None:
        lines += _format_transfer(t8, K, fmt, control_fmt)
    lines += ["", "## Figure 7: realization after training among base-unrealized questions, by base hit rate", "",
              "expected: the bin's realized count if realization were independent of the base hit rate (95% "
              "permutation interval).", "",
              markdown(prop[["pair", "K", "bin", "n", "realized", "realization", "realization_lo", "realization_hi",
                             "expected_realized", "expected_lo", "expected_hi"]])]
    return "\n".join(lines) + "\n"


def _format_transfer(t8, K: int, fmt: str, control_fmt: str) -> list[str]:
    """Table 8's section (`tables.format_transfer`)."""
    lines = ["", f"## Table 8: format transfer ({fmt} vs {control_fmt}); pool = base-reachable (K = {K}), "
             "not base-realized", "",
             "Base and trained checkpoints get the same prompt text in each format here, so this is whether gains "
             f"in {fmt} transfer to {control_fmt}, a format training need not have seen, not the paper's "
             "native-vs-shared confound (a checkpoint's own template against the base's).", "",
             f"| pair | pool | realized, {fmt} | realized, {control_fmt} | base realizes in "
             f"{control_fmt} | retained | D base {fmt} / {control_fmt} | D trained {fmt} / {control_fmt} |",
             "|---|---|---|---|---|---|---|---|"]
    for _, r in t8.iterrows():
        lines.append(f"| {r.pair} | {r.n_pool} | {_pct(r, 'realized_native')} | {_pct(r, 'realized_shared')} | "
                     f"{_pct(r, 'base_realized_shared')} | {_ratio(r)} | "
                     f"{r.D_base_native:.1%} / {r.D_base_shared:.1%} | "
                     f"{r.D_trained_native:.1%} / {r.D_trained_shared:.1%} |")
    return lines
