"""The RLVR study's tables from per-question records (``records.make_record`` rows) of checkpoints under one protocol.

    checkpoint_changes({"grpo": (base_K, grpo_K)}, m)                 # Table 5: D/O of both, delta n_reachable
    fates_table({"grpo": (base_K, grpo_K)}, base_samples=base_2K)     # Figure 6a's counts and their two nulls
    propensity({"grpo": (base, grpo)})                                # Figure 7: realization by base hit-rate bin
    checkpoint_changes_by_budget({"grpo": (base_2K, grpo_2K)}, K, m)  # Table 6: at K and 2K from one set of 2K
    deployed_vote_oracle({"base": base_2K, "grpo": ...}, K, m)        # Table 7, lineage: D, vote@K, O_K
    reach_curves({"base": base_2K, "grpo": ...})                      # reach@k, k = 1..2K, per checkpoint
    crossovers({"base": base_2K, "grpo": ...}, "base")                # where the base's reach@k overtakes
    reach_leads({"base": base_2K, "grpo": ...}, "base", K)            # base − trained reach@k, k = 1..2K, with its
                                                                      # band, and does the lead narrow after its peak
    format_transfer({"grpo": (base_K, grpo_K, base_shared, grpo_shared)})   # Table 8
    per_question({"base": base_2K, "grpo": ...}, "base", K=16)        # each question's D, hits/K, O and fate
    audit_tables(records, control, "base", K=16, T=0.8, m=None)       # all of them, by the file each is written to

``m`` is the number of options of a multiple-choice task, or each question's (None for free-form answers):
every oracle is reported beside the uniform guesser's ``1 - (1 - 1/m)^K`` (averaged over questions).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from reach_lens import audit
from reach_lens.rlvr.audit_run import records_at
from reach_lens.rlvr.fates import (REACH_N_BOOT, REACH_SEED, crossover, fate_counts, fates, gains_under_independence,
                                   gains_under_resampling, paired_change, reach_lead, realization_by_hit_rate_bin)
from reach_lens.stats import guessing_floor, pass_at_k, wilson_interval

FATE_COLUMNS = {
    "gains_from_reachable": ("realization", "newly_realized_from_reachable"),
    "gains_from_unreachable": ("realization", "newly_realized_from_unreachable"),
    "losses": ("realization", "lost"),
    "entered_reachable": ("reachability", "entered_reachable"),
    "left_reachable": ("reachability", "left_reachable"),
}


def _wilson(prefix: str, x: np.ndarray) -> dict:
    x = np.asarray(x, dtype=bool)
    lo, hi = wilson_interval(int(x.sum()), len(x))
    return {prefix: float(x.mean()) if len(x) else math.nan, f"{prefix}_lo": lo, f"{prefix}_hi": hi,
            f"{prefix}_n": len(x)}


def checkpoint_changes(pairs: Mapping[str, tuple[pd.DataFrame, pd.DataFrame]],
                       m: int | Sequence[int] | None) -> pd.DataFrame:
    """Base -> trained changes of D and O_K (the paper's Table 5), one row per (base, trained) pair of records at
    one K.

    Columns: pair, n, K, floor, D_base, O_base, D_trained, O_trained (Wilson 95%, _lo/_hi), D_change, O_change
    (trained - base: Newcombe paired 95% _lo/_hi, exact McNemar _p, _gained/_lost discordant counts),
    n_reachable_base/_trained, delta_n_reachable (with _lo/_hi = n x O_change's).
    """
    rows = []
    for label, (base, trained) in pairs.items():
        c = paired_change(base, trained)
        rows.append({"pair": label, "floor": guessing_floor(m, c["K"]), **c})
    return pd.DataFrame(rows)


def fates_table(pairs: Mapping[str, tuple[pd.DataFrame, pd.DataFrame]], seed: int = 0,
                base_samples: pd.DataFrame | None = None) -> pd.DataFrame:
    """Figure 6a: per pair, gains from base-reachable and from base-unreachable questions, losses, the net
    deployed change (gains - losses, = trained - base realized count), entered and left the reachable set, and
    two nulls for the gains from base-reachable questions:

    independence: ``gains_from_reachable_expected`` (gaining independent of base reachability: the gains spread
    over the base-unrealized questions in proportion to how many are reachable) with its 95% permutation interval
    (``_lo``, ``_hi``; `fates.gains_under_independence`);
    resampling: ``gains_from_reachable_expected_resampling`` (the trained greedy answer one draw from the base's
    own samples: question i gained with probability p_i = its base hit rate; expected sum p_i over the
    base-unrealized, base-reachable questions) with the 2.5% and 97.5% quantiles of the exact Poisson-binomial
    count (``_lo``, ``_hi``; `fates.gains_under_resampling`), and ``gains_from_unreachable_expected_resampling``
    (``_lo``, ``_hi``): sum p_i over the base-unreachable ones (0 when p is over the fates' own K samples).
    ``resampling_samples``: the number of base samples p_i is a hit rate over.

    ``base_samples``: the base's records over all its samples (e.g. 2K, of which each pair's base records hold
    the first K; the same greedy answers), shared by every pair: p_i = hits / K of these. Default: each pair's
    base records (p_i over the fates' K).
    """
    rows = []
    for label, (base, trained) in pairs.items():
        f = fates(base, trained)
        counts = fate_counts(f).set_index(["axis", "fate"])["count"]
        row = {"pair": label, "n": len(f), "K": int(f["K_base"].iloc[0])}
        row.update({name: int(counts[key]) for name, key in FATE_COLUMNS.items()})
        row["net_deployed_change"] = row["gains_from_reachable"] + row["gains_from_unreachable"] - row["losses"]
        row["net_reachable_change"] = row["entered_reachable"] - row["left_reachable"]
        chance = gains_under_independence(f, seed=seed)
        row.update({"gains_from_reachable_expected": chance["expected"],
                    "gains_from_reachable_expected_lo": chance["lo"], "gains_from_reachable_expected_hi": chance["hi"]})
        rates, samples = None, row["K"]
        if base_samples is not None:
            rates, samples = _hit_rates(base_samples, f, label)
        null = gains_under_resampling(f, rates)
        for col, (mean, lo, hi) in (("gains_from_reachable", ("expected", "lo", "hi")),
                                    ("gains_from_unreachable", ("expected_unreachable", "unreachable_lo",
                                                                "unreachable_hi"))):
            row.update({f"{col}_expected_resampling": null[mean], f"{col}_expected_resampling_lo": null[lo],
                        f"{col}_expected_resampling_hi": null[hi]})
        row["resampling_samples"] = samples
        rows.append(row)
    return pd.DataFrame(rows)


def _hit_rates(base_samples: pd.DataFrame, fates_df: pd.DataFrame, label: str) -> tuple[pd.Series, int]:
    """The base's hit rate hits / K by question_id from its records over all samples, checked against a pair's
    fates (every question present, the same greedy answer, at least the fates' K samples)."""
    b = base_samples.set_index("question_id")
    missing = sorted(set(fates_df["question_id"]) - set(b.index))
    if missing:
        raise ValueError(f"{label}: base_samples lack {len(missing)} of the pair's questions, e.g. {missing[:5]}")
    b = b.loc[fates_df["question_id"]]
    if (b["d"].astype(bool).to_numpy() != fates_df["d_base"].astype(bool).to_numpy()).any():
        raise ValueError(f"{label}: base_samples' greedy answers differ from the pair's base records: not its base")
    samples = audit.single_K(b)
    if samples < int(fates_df["K_base"].max()):
        raise ValueError(f"{label}: base_samples hold {samples} samples, fewer than the pair's K")
    return b["hits"] / b["K"], samples


def propensity(pairs: Mapping[str, tuple[pd.DataFrame, pd.DataFrame]],
               bins: Sequence[float] | None = None, seed: int = 0) -> pd.DataFrame:
    """Figure 7 for every pair: ``fates.realization_by_hit_rate_bin`` rows (with each bin's count expected under
    independence) with a pair column. The bins follow each pair's K (`fates.hit_rate_bins`: by default 0, 1,
    2-3, 4-7, ... hits of K; ``bins``: hit-rate edges instead, bins no c/K reaches merged into the next), and
    every row carries that K and its bin's edges (hits_lo, hits_hi; bin_lo, bin_hi = the same over K)."""
    frames = []
    for label, (base, trained) in pairs.items():
        t = realization_by_hit_rate_bin(base, trained, bins, seed=seed)
        t.insert(0, "pair", label)
        frames.append(t)
    return pd.concat(frames, ignore_index=True)


def _reach_at(records: pd.DataFrame, k: int) -> float:
    """Mean over questions of the unbiased pass@k from all of each question's candidates."""
    return float(np.mean([pass_at_k(int(K), int(h), k) for K, h in zip(records["K"], records["hits"])]))


def checkpoint_changes_by_budget(pairs: Mapping[str, tuple[pd.DataFrame, pd.DataFrame]], K: int,
                                 m: int | Sequence[int] | None) -> pd.DataFrame:
    """Base -> trained changes at two budgets, K and 2K, from records of 2K samples (the paper's Table 6, its budget
    control): one row per pair and budget.

    At each budget: O of base and trained on that many samples (the first K, or all 2K; Wilson 95%), their
    gaps O - D, the paper's gap O_base - O_trained (``O_drop``: Newcombe paired 95%, exact McNemar ``O_drop_p``), delta n_reachable
    with n x O_change's interval, and at K also the unbiased reach@K of
    each side estimated from all 2K samples (``reach_base_unbiased``, ``reach_trained_unbiased``).
    """
    rows = []
    for label, (base, trained) in pairs.items():
        total = int(base["K"].iloc[0])
        for k in sorted({K, total}):
            b, t = (records_at(base, k), records_at(trained, k)) if k != total else (base, trained)
            c = paired_change(b, t)
            rows.append({"pair": label, "n": c["n"], "K": k, "samples": total, "floor": guessing_floor(m, k),
                         **{f"{x}_{s}{e}": c[f"{x}_{s}{e}"] for x in ("D", "O") for s in ("base", "trained")
                            for e in ("", "_lo", "_hi")},
                         "gap_base": c["O_base"] - c["D_base"], "gap_trained": c["O_trained"] - c["D_trained"],
                         "O_drop": -c["O_change"], "O_drop_lo": -c["O_change_hi"], "O_drop_hi": -c["O_change_lo"],
                         "O_drop_p": c["O_change_p"],
                         "delta_n_reachable": c["delta_n_reachable"], "delta_n_reachable_lo": c["delta_n_reachable_lo"],
                         "delta_n_reachable_hi": c["delta_n_reachable_hi"],
                         "reach_base_unbiased": _reach_at(base, k), "reach_trained_unbiased": _reach_at(trained, k)})
    return pd.DataFrame(rows)


def reach_curves(checkpoints: Mapping[str, pd.DataFrame], n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """reach@k for k = 1..K (K: all of a checkpoint's samples) per checkpoint: the unbiased pass@k averaged over
    questions with its question-bootstrap 95% band (`audit.reach_curve`). Columns: checkpoint, k, reach, lo, hi,
    n, K."""
    frames = []
    for label, records in checkpoints.items():
        curve = audit.reach_curve(records, n_boot=n_boot, seed=seed)
        curve.insert(0, "checkpoint", label)
        frames.append(curve)
    return pd.concat(frames, ignore_index=True)


def crossovers(checkpoints: Mapping[str, pd.DataFrame], base_label: str, n_boot: int = 2000,
               seed: int = 0) -> pd.DataFrame:
    """Per trained checkpoint (every checkpoint but ``base_label``), where the base's reach@k curve meets its own
    over k = 1..K (all samples; one K for both), on the questions both answered (`fates.fates`' join):
    `fates.crossover` of their per-question unbiased pass@k.

    Columns: pair, base, n, K, crossed (the base overtakes at some k <= K), k_cross (the smallest k with base
    reach@k >= trained; empty when none), k_min_gap (the k of the smallest gap trained - base), min_gap,
    min_gap_lo, min_gap_hi (its paired question-bootstrap 95% interval at that k), k_max_gap and max_gap (where the
    gap peaks), gap_K, gap_K_lo, gap_K_hi (the gap at k = K with its interval), reach_base_K and reach_trained_K
    (reach@K = O over all K samples).
    """
    if base_label not in checkpoints:
        raise ValueError(f"base {base_label!r} is not among the checkpoints {list(checkpoints)}")
    rows = []
    for label, trained in checkpoints.items():
        if label == base_label:
            continue
        f = fates(checkpoints[base_label], trained)
        K = int(f["K_base"].iloc[0])
        ks = list(range(1, K + 1))
        b, t = audit.pass_at_ks(f["hits_base"], K, ks), audit.pass_at_ks(f["hits_trained"], K, ks)
        c = crossover(b, t, ks, n_boot=n_boot, seed=seed)
        rows.append({"pair": label, "base": base_label, "n": len(f), "K": K, "crossed": c["k_cross"] is not None,
                     "k_cross": c["k_cross"], "k_min_gap": c["k_min_gap"], "min_gap": c["min_gap"],
                     "min_gap_lo": c["lo"], "min_gap_hi": c["hi"], "k_max_gap": c["k_max_gap"],
                     "max_gap": c["max_gap"], "gap_K": c["gap_last"], "gap_K_lo": c["gap_last_lo"],
                     "gap_K_hi": c["gap_last_hi"], "reach_base_K": float(b[:, -1].mean()),
                     "reach_trained_K": float(t[:, -1].mean())})
    out = pd.DataFrame(rows)
    if len(out):
        out["k_cross"] = out["k_cross"].astype("Int64")
    return out


def reach_leads(checkpoints: Mapping[str, pd.DataFrame], base_label: str, K: int, n_boot: int = REACH_N_BOOT,
                seed: int = REACH_SEED) -> tuple[pd.DataFrame, pd.DataFrame]:
    """base − trained reach@k for k = 1..2K per trained checkpoint (every checkpoint but ``base_label``; records of
    2K samples) on the questions both answered, and whether the trained checkpoint's lead narrows from its peak to
    k = 2K, from one set of ``n_boot`` paired question resamples (`fates.reach_lead`). Every point is the unbiased
    pass@k from all 2K samples of each question, averaged.

    Returns (differences, narrowing). differences, one row per pair and k: pair, base, k, reach_base,
    reach_trained, base_minus_trained with its pointwise 95% band (base_minus_trained_lo, _hi), n, K, samples (2K),
    n_boot, seed. narrowing, one row per pair: pair, base, n, K, samples, k_peak (the k of the largest point
    estimate of the lead trained − base; chosen again in every resample), lead_peak, lead_last (the lead at k = 2K),
    narrowing (lead_peak − lead_last, >= 0) with its basic bootstrap 95% interval (narrowing_lo, _hi), narrows
    (the interval excludes 0, the lead at the peak is positive and the peak lies before 2K), n_boot, seed.
    """
    if base_label not in checkpoints or len(checkpoints) < 2:
        raise ValueError(f"checkpoints {list(checkpoints)}: need the base {base_label!r} and a trained one")
    curves, rows = [], []
    for label, trained in checkpoints.items():
        if label == base_label:
            continue
        f = fates(checkpoints[base_label], trained)
        samples = int(f["K_base"].iloc[0])
        if samples != 2 * K:
            raise ValueError(f"{label}: records of {samples} samples, not 2K = {2 * K} (K = {K}): reach@k is "
                             "estimated from all 2K samples of each question")
        ks = list(range(1, samples + 1))
        b, t = audit.pass_at_ks(f["hits_base"], samples, ks), audit.pass_at_ks(f["hits_trained"], samples, ks)
        lead = reach_lead(b, t, ks, n_boot=n_boot, seed=seed)
        common = {"n": len(f), "K": K, "samples": samples}
        curves.append(pd.DataFrame({"pair": label, "base": base_label, "k": ks, "reach_base": b.mean(axis=0),
                                    "reach_trained": t.mean(axis=0), "base_minus_trained": lead["diff"],
                                    "base_minus_trained_lo": lead["lo"], "base_minus_trained_hi": lead["hi"],
                                    **common, "n_boot": n_boot, "seed": seed}))
        rows.append({"pair": label, "base": base_label, **common,
                     **{c: lead[c] for c in ("k_peak", "lead_peak", "lead_last", "narrowing", "narrowing_lo",
                                             "narrowing_hi", "narrows", "n_boot", "seed")}})
    return pd.concat(curves, ignore_index=True), pd.DataFrame(rows)


def deployed_vote_oracle(checkpoints: Mapping[str, pd.DataFrame], K: int,
                         m: int | Sequence[int] | None) -> pd.DataFrame:
    """Lineage control (the paper's Table 7): per checkpoint, deployed D, majority vote@K and oracle O_K (Wilson
    95%), O at all samples."""
    rows = []
    for label, records in checkpoints.items():
        total = int(records["K"].iloc[0])
        at_k = records_at(records, K) if K != total else records
        rows.append({"checkpoint": label, "n": len(records), "K": K, "floor": guessing_floor(m, K),
                     **_wilson("D", at_k["d"]), **_wilson("vote", at_k["vote_correct"]), **_wilson("O", at_k["o"]),
                     "samples": total, **_wilson("O_all", records["o"]), "floor_all": guessing_floor(m, total),
                     "format_failure_rate": float(at_k["format_failures"].sum() / (K * len(at_k)))})
    return pd.DataFrame(rows)


def format_transfer(cells: Mapping[str, tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]],
                    n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Format transfer (the paper's Table 8), per trained checkpoint: (base records at K in the trained format,
    trained records at K in it, base greedy answers in the control format, trained greedy answers in it, as
    ``runs.RunLoop.deployed`` gives them). When base and trained checkpoints share one prompt template (as LoRA
    checkpoints of one model do), this measures whether gains transfer to a prompt training never saw; only a
    checkpoint that brings its own chat template measures the paper's native vs shared format confound.

    Population P: questions base-reachable but not base-realized under the native protocol. Columns: pair,
    n (all questions), n_pool (|P|), D_base/D_trained under each format (``_native``, ``_shared``; Wilson),
    realized_native and realized_shared (share of P the trained checkpoint realizes in each format, Wilson),
    base_realized_shared (share of P the base realizes in the shared format: gains the format alone gives),
    retained (realized_shared / realized_native, percentile bootstrap over P; NaN when nothing is realized
    natively).
    """
    rows = []
    for label, (base, trained, base_shared, trained_shared) in cells.items():
        ids = list(base["question_id"])
        for name, t in (("trained", trained), ("base shared", base_shared), ("trained shared", trained_shared)):
            if sorted(t["question_id"]) != sorted(ids):
                raise ValueError(f"{label}: {name} rows are not the base's question set")
        d = {k: t.set_index("question_id").loc[ids, column].astype(bool).to_numpy()
             for k, t, column in (("bn", base, "d"), ("tn", trained, "d"), ("bs", base_shared, "correct"),
                                  ("ts", trained_shared, "correct"))}
        pool = (base.set_index("question_id").loc[ids, "o"].astype(bool).to_numpy()) & ~d["bn"]
        nat, sh = d["tn"][pool], d["ts"][pool]
        retained = float(sh.mean() / nat.mean()) if nat.any() else math.nan
        if nat.any():
            idx = np.random.default_rng(seed).integers(0, len(nat), size=(n_boot, len(nat)))
            ratios = [s.sum() / t.sum() for s, t in zip(sh[idx], nat[idx]) if t.sum() > 0]
            lo, hi = (float(x) for x in np.quantile(ratios, [0.025, 0.975]))
        else:
            lo = hi = math.nan
        rows.append({"pair": label, "n": len(ids), "n_pool": int(pool.sum()),
                     **_wilson("D_base_native", d["bn"]), **_wilson("D_base_shared", d["bs"]),
                     **_wilson("D_trained_native", d["tn"]), **_wilson("D_trained_shared", d["ts"]),
                     **_wilson("realized_native", nat), **_wilson("realized_shared", sh),
                     **_wilson("base_realized_shared", d["bs"][pool]),
                     "retained": retained, "retained_lo": lo, "retained_hi": hi})
    return pd.DataFrame(rows)


def per_question(records: Mapping[str, pd.DataFrame], base: str, K: int) -> pd.DataFrame:
    """One row per question and trained checkpoint (``pair``): base and trained D, hits and O at K (the first K
    samples) and over all samples (``hits_all_*``, ``o_all_*`` of ``samples``), and the question's fate at K on both
    axes (`fates.fates`: realization, reachability)."""
    frames = []
    for label, trained in records.items():
        if label == base:
            continue
        f = fates(records_at(records[base], K), records_at(trained, K))
        everything = fates(records[base], trained)[["question_id", "hits_base", "o_base", "hits_trained", "o_trained",
                                                      "K_base"]]
        everything.columns = ["question_id", "hits_all_base", "o_all_base", "hits_all_trained", "o_all_trained",
                              "samples"]
        frames.append(f.merge(everything, on="question_id", how="left", validate="one_to_one").assign(pair=label))
    out = pd.concat(frames, ignore_index=True)
    return out[["pair", *[c for c in out.columns if c != "pair"]]]


def audit_tables(records: Mapping[str, pd.DataFrame], control: Mapping[str, pd.DataFrame] | None, base: str, K: int,
                 T: float, m: int | Sequence[int] | None, bins: Sequence[float] | None = None,
                 seed: int = 0) -> dict[str, pd.DataFrame]:
    """Every table of one audit, by the name of its file: ``records`` maps each checkpoint (``base`` among them) to
    its records of 2K samples, ``control`` to its greedy answers in the control format (``runs.RunLoop.deployed``
    rows; None: no format-transfer table); ``K`` is the main budget, ``T`` the temperature (a column of every
    table), ``bins`` the propensity's hit-rate edges (default: hit counts that follow K). Every reach@k (curves,
    crossovers, base − trained with its band, narrowing) is the unbiased estimator from all 2K samples."""
    for label, r in records.items():
        if audit.single_K(r) != 2 * K:
            raise ValueError(f"{label}: records of {audit.single_K(r)} samples, not 2K = {2 * K} (K = {K}): every "
                             "reach@k is estimated from all 2K samples")
    trained = [label for label in records if label != base]
    at_k = {label: records_at(r, K) for label, r in records.items()}
    pairs_k = {label: (at_k[base], at_k[label]) for label in trained}
    pairs_2k = {label: (records[base], records[label]) for label in trained}
    curves = reach_curves(records, seed=seed)
    curves["guess"] = guessing_floor(m, curves["k"])  # the multiple-choice floor; NaN for free-form answers
    differences, narrowing = reach_leads(records, base, K, seed=seed)
    out = {"table5": checkpoint_changes(pairs_k, m),
           "fates": fates_table(pairs_k, seed=seed, base_samples=records[base]),
           "propensity": pd.concat([propensity(pairs_k, bins, seed=seed), propensity(pairs_2k, bins, seed=seed)],
                                   ignore_index=True),
           "table6_budget": checkpoint_changes_by_budget(pairs_2k, K, m),
           "table7_lineage": deployed_vote_oracle(records, K, m),
           "reach_curves": curves, "crossover": crossovers(records, base, seed=seed),
           "reach_difference": differences, "narrowing": narrowing,
           "questions": per_question(records, base, K)}
    if control is not None:
        out["table8_format_transfer"] = format_transfer(
            {label: (at_k[base], at_k[label], control[base], control[label]) for label in trained}, seed=seed)
    for table in out.values():
        table.insert(1, "T", T)
    return out
