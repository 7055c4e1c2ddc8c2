"""The study's outputs: tables (CSV), figures and ``summary.md``, every rate with its n and 95% interval."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from reach_lens import plots
from reach_lens.localize.panels import HEALTHY_RULE_TEXT, format_failures, panel_sizes
from reach_lens.localize.units import UNIT_RANK_TEXT
from reach_lens.localize.verdict import RULE_TEXT, identify_layer
from reach_lens.stats import p_text


@dataclass
class Study:
    """Everything one run found; ``settings`` holds the run's arguments (task, fmt, recognition, ...)."""

    tag: str
    settings: dict
    screened: pd.DataFrame
    panels: pd.DataFrame
    eligible: dict
    sweep: pd.DataFrame
    layer: int
    evaluation: pd.DataFrame
    margins: pd.DataFrame
    verdict: dict
    baseline: dict
    v_info: dict
    steering: pd.DataFrame
    doses: dict
    units: pd.DataFrame
    planted: dict | None = None
    pruned: dict | None = None  # pruning-created failures: sparsity, questions screened unpruned, pool
    conditions: pd.DataFrame | None = None  # the store's per-question condition rows (condition, question_id, correct)
    units_layer: int | None = None  # where the units step ran when not at ``layer`` (an SAE at another MLP)
    elapsed_s: float = 0.0
    peak_mb: float = 0.0
    tables: dict = field(default_factory=dict)


def pct(rate: float, lo: float, hi: float, k: int, n: int) -> str:
    return f"{rate:.1%} ({int(k)}/{int(n)}; 95% CI {lo:.1%}-{hi:.1%})"


def rate_text(row, name: str) -> str:
    get = row.get if isinstance(row, dict) else row.__getitem__
    return pct(get(name), get(f"{name}_lo"), get(f"{name}_hi"), get(f"{name}_k"), get(f"{name}_n"))


def margin_text(m) -> str:
    return (f"{m['diff'] * 100:+.1f} pp [{m['lo'] * 100:+.1f}, {m['hi'] * 100:+.1f}], {p_text(m['p'])} "
            f"({int(m['a_only'])} vs {int(m['b_only'])} repaired by one only)")


def _selection(s: Study) -> list[str]:
    st, sweep = s.settings, s.sweep
    mlp = sweep[sweep.component == "mlp"].set_index("layer")
    rule, other_rule = st["layer_rule"], "repair" if st["layer_rule"] == "net" else "net"
    other = identify_layer(sweep, other_rule)
    sizes = panel_sizes(s.panels)
    lines = [f"## Selection sweep (calibration: {sizes['failure', 'calibration']} failures, "
             f"{sizes['healthy', 'calibration']} healthy; MLP and attention silenced at each of "
             f"{sweep.layer.nunique()} layers)",
             f"Identified MLP {s.layer} by the {RULE_TEXT[rule]} among MLP blocks: calibration repair "
             f"{rate_text(mlp.loc[s.layer], 'repair')}, breakage {rate_text(mlp.loc[s.layer], 'breakage')}."]
    if other != s.layer:
        lines[-1] += (f" The {RULE_TEXT[other_rule]} is MLP {other} (repair {mlp.loc[other, 'repair']:.1%}, "
                      f"breakage {mlp.loc[other, 'breakage']:.1%}).")
    if (mlp.repair - mlp.breakage).max() <= 0:
        lines[-1] += " No MLP block repairs more calibration failures than it breaks healthy answers."
    runners = s.evaluation[~s.evaluation.label.isin(["identified", "whole layer (contains it)"])]
    lines.append("Runner-ups chosen on calibration by the same rule: " + "; ".join(
        f"{r.label}: {r.name} (calibration repair {r.cal_repair:.1%}, breakage {r.cal_breakage:.1%})"
        for r in runners.itertuples()) + ".")
    lines.append(f"MLP repair across layers (calibration): median {mlp.repair.median():.1%}, "
                 f"max {mlp.repair.max():.1%}; "
                 f"attention repair max {sweep[sweep.component == 'attn'].repair.max():.1%}.")
    return lines


def _evaluation(s: Study) -> list[str]:
    sizes = panel_sizes(s.panels)
    b = s.baseline
    lines = ["", f"## Evaluation ({sizes['failure', 'evaluation']} failures, {sizes['healthy', 'evaluation']} healthy; "
             "nothing here was used to choose)",
             f"Without intervention: repair {int(b['repair_k'])}/{int(b['repair_n'])}, breakage "
             f"{int(b['breakage_k'])}/{int(b['breakage_n'])}"
             + (" (the panels reproduce)." if b["repair_k"] == 0 and b["breakage_k"] == 0 else
                " (NOT 0: the panels do not reproduce; read every rate below against this)."), "",
             f"| silenced | role | repair of failures | breakage of healthy | margin: MLP {s.layer} repair minus "
             "this one's (paired: Newcombe 95%, exact McNemar p) |", "|---|---|---|---|---|"]
    by_name = s.margins.set_index("name")
    for r in s.evaluation.itertuples():
        margin = margin_text(by_name.loc[r.name]) if r.name in by_name.index else "—"
        lines.append(f"| {r.name} | {r.label} | {rate_text(r._asdict(), 'repair')} | "
                     f"{rate_text(r._asdict(), 'breakage')} | {margin} |")
    lines += ["", "Verdict: " + s.verdict["text"]]
    if not s.planted and not s.verdict["locus"]:
        lines[-1] += (f" Found: MLP {s.layer} fails that test, so this run does not reproduce the source study's "
                      "MLP locus (67.6-92.0% repair).")
    return lines


def _steering(s: Study) -> list[str]:
    v, st = s.v_info, s.steering
    lines = ["", f"## Steering along v at MLP {s.layer}",
             f"v = mean MLP output (last prompt token) of {v['n_failure']} calibration failures minus that of "
             f"{v['n_healthy']} calibration healthy questions (|v| = {v['norm']:.2f}; mean MLP output norm there "
             f"{v['mlp_out_norm']:.2f}); alpha = 1 moves the failure mean onto the healthy mean. Rescue: -alpha v on "
             "failures; induction: +alpha v on healthy questions. Where: v is measured at the last prompt token only; "
             f"+-alpha v is added to the output of MLP {s.layer} at every position, each prompt token and each "
             "generated token, for the whole greedy answer. The random direction (a Gaussian direction scaled to "
             "|v|) is measured on evaluation at every alpha.", "",
             "| alpha | rescue, calibration | rescue, evaluation | rescue, random direction | induction, calibration "
             "| induction, evaluation | induction, random direction |", "|---|---|---|---|---|---|---|"]
    rand = st[st.role == "random direction"].set_index("alpha")
    for alpha in sorted(st.alpha.unique()):
        c = st[(st.alpha == alpha) & (st.role == "calibration")].iloc[0].to_dict()
        e = st[(st.alpha == alpha) & (st.role == "evaluation")].iloc[0].to_dict()
        r = rand.loc[alpha].to_dict() if alpha in rand.index else None

        def random(which: str) -> str:
            return rate_text(r, which) if r is not None and np.isfinite(r.get(which, np.nan)) else "—"
        lines.append(f"| {alpha:g} | {rate_text(c, 'rescue')} | {rate_text(e, 'rescue')} | {random('rescue')} | "
                     f"{rate_text(c, 'induction')} | {rate_text(e, 'induction')} | {random('induction')} |")
    ev = st[st.role == "evaluation"].set_index("alpha")
    r, i = s.doses["rescue"], s.doses["induction"]
    lines += ["", f"Doses chosen on calibration (largest rate, smaller alpha on ties), reported on evaluation: rescue "
              f"alpha = {r:g}: {rate_text(ev.loc[r].to_dict(), 'rescue')}; induction alpha = {i:g}: "
              f"{rate_text(ev.loc[i].to_dict(), 'induction')}."]
    return lines


def _units(s: Study) -> list[str]:
    u, k = s.units, s.settings["unit_k"]
    block, top, rand = u.iloc[0], u[u.arm == "top"].iloc[0], u[u.arm == "random"]
    latents = u.space.iloc[0] == "SAE latents"
    what, mass_of = ("SAE latents", "the SAE decoder's") if latents else ("units", "the block's")
    layer = s.units_layer if s.units_layer is not None else s.layer
    share = (f"{top.repair_vs_block:.0%} of the whole block's" if np.isfinite(top.repair_vs_block) else
             "the whole block repairs nothing, so no share of its")
    rank = s.settings.get("unit_rank", "weights")
    writes = "the decoder row d_i" if latents else "W_out[u]"
    lines = ["", f"## Top-{k} {what} along v at MLP {layer} (evaluation failures, n = {int(block.repair_n)})",
             f"Ranked by {UNIT_RANK_TEXT[rank].replace('w_u', writes)} (rule '{rank}'); chosen on the calibration "
             "questions, measured on the evaluation failures."]
    if layer != s.layer:
        lines.append(f"The SAE sits at MLP {layer}, not at the identified MLP {s.layer}: v and the block reference "
                     f"below are those of MLP {layer} (v from the same calibration questions).")
    lines.append(
        f"Whole block silenced: repair {rate_text(block.to_dict(), 'repair')}. Top-{k} {what} silenced: repair "
        f"{rate_text(top.to_dict(), 'repair')} ({share} repair), {top.mass:.1%} of {mass_of} output mass. "
        f"Random-{k} sets ({len(rand)}, disjoint from the top set): repair {rand.repair.mean():.1%} ± "
        f"{rand.repair.std(ddof=1):.1%} (SD over sets)"
        + (f", {rand.repair_vs_block.mean():.0%} ± {rand.repair_vs_block.std(ddof=1):.0%} of the block's"
           if np.isfinite(top.repair_vs_block) else "")
        + f"; mass {rand.mass.mean():.1%} ± {rand.mass.std(ddof=1):.1%}.")
    if s.planted and s.planted.get("units") and not latents:
        planted = set(s.planted["units"])
        lines.append(f"Planted units among the top-{k}: {len(planted & set(top.units))} of {len(planted)}.")
    return lines


def _planted(s: Study) -> tuple[list[str], list[str]]:
    p, scr = s.planted, s.screened
    if not p:
        return [], []
    what = ("output-bias push" if p["kind"] == "bias" else
            f"rank-1 W_out edit on {len(p['units'])} units that fire on {p['triggered']} of the {p['pool']} pool "
            f"questions (trigger set)")
    head = [f"Positive control ({p['kind']}): a direct-answer failure planted in MLP {p['planted_layer']} ({what}, "
            f"towards {p['target']!r}, strength {p['strength']:g}): {p['flip_measured']:.0%} of the {p['measured']} "
            "measured questions answer wrongly" + (f", {p['flip_others']:.0%} of the other susceptible ones"
                                                 if p.get("flip_others") is not None else "") +
            f". Pool: {p['pool']} questions the unedited model recognizes and generates, also with MLP "
            f"{p['planted_layer']} silenced (of {p['base_correct']}); after the edit {scr.recognized.mean():.1%} are "
            f"still recognized and {scr.generated.mean():.1%} generated.", ""]
    found = s.layer == p["planted_layer"]
    tail = ["", "## Positive control verdict",
            f"Planted MLP {p['planted_layer']}, identified MLP {s.layer}: "
            + ("found" if found else "NOT found") + "; " + ("locus claimed." if s.verdict["locus"] else
                                                              "no locus claimed (see the verdict).")]
    if p["kind"] == "bias":
        tail.append("The bias push is the same on every question (the easy control): it tests the layer sweep, not "
                    "selectivity, steering or units (v cannot carry a push both panels receive; no unit holds a bias).")
    return head, tail


def _pruned(s: Study) -> list[str]:
    """The pruning-created construction in words, or nothing for any other run."""
    p, scr = s.pruned, s.screened
    if not p:
        return []
    return [f"Pruning-created failures (the source study's construction): the unpruned model recognizes and generates "
            f"{p['pool']} of {p['screened']} screened questions (the pool); its MLP weights magnitude-pruned at "
            f"{p['sparsity']:.0%}, it still recognizes {scr.recognized.mean():.1%} of the pool and generates "
            f"{scr.generated.mean():.1%}, so every failure below is one pruning created.", ""]


def _format_failures(s: Study) -> str:
    """How many failure questions had a greedy answer no letter was read from, and what the run did with them."""
    scr, panels = s.screened, s.panels
    unread = ~scr.gen_format_ok.astype(bool) & scr.recognized.astype(bool) & ~scr.generated.astype(bool)
    roles = {r: format_failures(scr, panels.question_id[(panels.panel == "failure") & (panels.role == r)])
             for r in ("calibration", "evaluation")}
    if s.settings.get("exclude_format_failures"):
        return (f"Unparseable greedy answers (no letter read): {int(unread.sum())} recognized questions, left out of "
                "the failure set (--exclude-format-failures).")
    return (f"Unparseable greedy answers (no letter read) among the failures: {int(unread.sum())} of the "
            f"{s.eligible['failure']} eligible, {roles['calibration']} calibration + {roles['evaluation']} "
            "evaluation (counted as failures; --exclude-format-failures leaves them out).")


def summary(s: Study) -> str:
    st, scr = s.settings, s.screened
    sizes = panel_sizes(s.panels)
    head, tail = _planted(s)
    lines = [f"# MLP localization: {s.tag}", "", *head, *_pruned(s),
             f"Screened n={len(scr)} questions ({st['task']}, format {st['fmt']}, recognition by {st['recognition']} "
             f"log-likelihood): recognition {scr.recognized.mean():.1%}, greedy generation {scr.generated.mean():.1%}, "
             f"generation format failures {1 - scr.gen_format_ok.mean():.1%}.",
             f"Failure set (recognized, not generated): {s.eligible['failure']} eligible, "
             f"{sizes['failure', 'calibration']} calibration + {sizes['failure', 'evaluation']} evaluation. "
             + _format_failures(s) + " "
             f"Healthy panel (rule '{st['healthy_rule']}': {HEALTHY_RULE_TEXT[st['healthy_rule']]}): "
             f"{s.eligible['healthy']} eligible, "
             f"{sizes['healthy', 'calibration']} calibration + {sizes['healthy', 'evaluation']} evaluation. Split: "
             f"sha256(panel-split:seed:id) < {st['calibration_share']} is calibration (at most {st['max_calibration']} "
             f"per panel), the rest evaluation (at most {st['max_eval']} per panel).",
             "Which split chose what: the calibration questions chose the MLP layer, the runner-ups, the direction v, "
             "both steering doses and the top units; the evaluation questions measured every rate, margin and verdict "
             "below the selection sweep.", "", *_selection(s), *_evaluation(s), *_steering(s), *_units(s), *tail,
             "", f"Wall time {s.elapsed_s / 60:.1f} min (this invocation; a resumed run counts only what it computed), "
             f"peak memory {s.peak_mb:.0f} MB (this process).", ""]
    return "\n".join(lines)


def question_table(s: Study) -> pd.DataFrame:
    """One row per screened question: its screen (gold, recognized, generated, the greedy answer), its panel and
    role (empty outside the panels), and per condition run on it whether the answer was correct (a column per
    condition, e.g. ``silence-mlp-24``; empty where the condition did not run on that question)."""
    keep = ["question_id", "gold", "recognized", "recog_pred", "generated", "gen_answer", "gen_format_ok"]
    table = s.screened[[c for c in keep if c in s.screened.columns]].merge(s.panels, on="question_id", how="left")
    if s.conditions is not None and len(s.conditions):
        outcomes = s.conditions.pivot_table(index="question_id", columns="condition", values="correct",
                                            aggfunc="first").astype("boolean")
        table = table.merge(outcomes.reset_index(), on="question_id", how="left")
    return table


def write_outputs(s: Study, run_dir: Path, figures: Path) -> str:
    """CSV tables (``questions.csv``: `question_table`), the three figures (also copied to ``figures``) and
    summary.md; returns the summary."""
    tables = {"screen": s.screened, "panels": s.panels, "layer_sweep": s.sweep, "evaluation": s.evaluation,
              "margins": s.margins, "steering": s.steering, "units": s.units, "questions": question_table(s)}
    for name, table in tables.items():
        table.to_csv(run_dir / f"{name}.csv", index=False)
    sizes = panel_sizes(s.panels)
    cal, ev = sizes["failure", "calibration"], sizes["failure", "evaluation"]  # of the eligible, as Figure 4b counts
    marks = [(r.component, int(r.layer), r.label) for r in s.evaluation.itertuples() if r.label != "identified"
             and r.component != "layer"]
    drawn = {
        "layer_sweep": plots.plot_layer_sweep(s.sweep, marked_layer=s.layer, title=f"Silencing by layer: {s.tag}; "
                                              f"failures evaluated/eligible {cal}+{ev}/{s.eligible['failure']}",
                                              runner_ups=marks, evaluation=s.evaluation),
        "steering": plots.plot_steering(s.steering, doses=s.doses, title=f"Steering along v at MLP {s.layer}: {s.tag}"),
        "units": plots.plot_units_vs_block(s.units, title=f"{s.units.space.iloc[0]} along v at MLP "
                                           f"{s.layer if s.units_layer is None else s.units_layer}: {s.tag}"),
    }
    for name, fig in drawn.items():
        plots.save(fig, run_dir / f"{name}.png")
        plots.save(fig, figures / f"mlp_localize_{name}_{s.tag}.png")
    text = summary(s)
    (run_dir / "summary.md").write_text(text)
    return text



