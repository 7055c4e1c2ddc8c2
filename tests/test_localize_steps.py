"""What each split chooses and measures, on scripted answers: the layer and runner-ups come from the calibration
questions, every reported rate from the evaluation questions; each steering direction gets its own dose.
Also the figures' data (read back from the artists)."""
import json

import numpy as np
import pandas as pd
import pytest
import torch

from reach_lens import localize, plots
from reach_lens.interventions import Silence, Steer
from reach_lens.protocol import Protocol
from reach_lens.store import RunStore
from reach_lens.tasks import Question, get_task


class Scripted(localize.Conditions):
    """Conditions whose answers come from ``script(interventions, role, panel, index) -> correct``."""

    def __init__(self, script, *args, **kwargs):
        self.script, self.calls = script, []
        super().__init__(*args, **kwargs)

    def answer(self, questions, interventions):
        place = self.panels.set_index("question_id")
        self.calls.append((tuple(interventions), {place.loc[q.id, "role"] for q in questions}))
        out = []
        for q in questions:
            role, panel = place.loc[q.id, ["role", "panel"]]
            index = int(q.id.split("-")[-1])
            out.append({"correct": bool(self.script(tuple(interventions), role, panel, index)), "answer": "A"})
        return out


def scripted(tmp_path, tiny_model, script, n=10):
    questions = [Question(f"{p}-{r}-{i}", "?", "A", ("x", "y"), ("A", "B")) for p in ("failure", "healthy")
                 for r in ("calibration", "evaluation") for i in range(n)]
    panels = pd.DataFrame([{"question_id": q.id, "panel": q.id.split("-")[0], "role": q.id.split("-")[1]}
                           for q in questions])
    task = get_task("arc_easy")
    protocol = Protocol(study="test", model="tiny", weights="0", task="arc_easy", source=None, split=None,
                        questions="0" * 64, n=len(questions), seed=0, fmt="native", grader="mc_letter/2",
                        probe="screen", K=None, temperature=0.0, max_new_tokens=8, stop_strings=())
    store = RunStore(tmp_path / "run", protocol)
    return Scripted(script, tiny_model, task, "native", store, panels, questions)


def silencing_script(interventions, role, panel, index):
    """Calibration: MLP 2 repairs 9/10 and breaks nothing, MLP 1 repairs 5/10. Evaluation: the reverse ranking
    (MLP 1 repairs everything, MLP 2 nothing): a selection on evaluation questions would pick MLP 1."""
    healthy = panel == "healthy"
    if not interventions:
        return healthy
    (iv,) = interventions
    if not isinstance(iv, Silence):
        return healthy
    repaired = {("calibration", "hook_mlp_out", 2): index < 9, ("calibration", "hook_mlp_out", 1): index < 5,
                ("calibration", "hook_attn_out", 0): index < 3, ("evaluation", "hook_mlp_out", 1): True,
                ("evaluation", "hook_attn_out", 0): index < 8}.get((role, iv.site, iv.layer), False)
    return healthy or repaired


def test_the_layer_and_runner_ups_are_chosen_on_calibration_and_reported_on_evaluation(tmp_path, tiny_model):
    conditions = scripted(tmp_path, tiny_model, silencing_script)
    sweep = localize.selection_sweep(conditions, [0, 1, 2])
    assert set(sweep.role) == {"calibration"} and all(roles == {"calibration"} for _, roles in conditions.calls)
    assert sweep.set_index(["component", "layer"]).loc[("mlp", 2), "repair"] == 0.9
    layer = localize.identify_layer(sweep, "net")
    assert layer == 2  # calibration's best; the evaluation questions would have picked MLP 1
    conditions.calls.clear()
    table, margins, verdict = localize.evaluate_choice(conditions, sweep, layer, "net", top=2)
    assert all(roles == {"evaluation"} for _, roles in conditions.calls)
    rows = table.set_index("name")
    assert list(rows.index[:3]) == ["MLP 2", "attention 2", "whole layer 2"]
    assert rows.loc["MLP 2", "repair"] == 0 and rows.loc["MLP 2", "cal_repair"] == 0.9  # evaluation rates, reported
    assert rows.loc["MLP 1", "label"] == "best component, best other MLP" and rows.loc["MLP 1", "repair"] == 1.0
    assert rows.loc["attention 0", "label"] == "runner-up 2"
    m = margins.set_index("name")
    assert "whole layer 2" not in m.index and m.loc["MLP 1", "diff"] == -1.0 and m.loc["attention 0", "hi"] < 0
    assert not verdict["locus"] and set(verdict["beaten_by"]) == {"MLP 1", "attention 0"}
    assert localize.baseline_check(conditions)["repair_k"] == 0


def test_the_studys_components_silence_their_hook_points_under_their_own_names(tmp_path, tiny_model):
    """The study's words for its rows ("mlp", "attn", "layer") name its conditions; the interventions they build
    act at the hook points of those components."""
    assert localize.silence_component("mlp", 2) == Silence(2, "hook_mlp_out")
    assert localize.silence_component("attn", 2) == Silence(2, "hook_attn_out")
    assert localize.silence_component("layer", 2) == Silence(2, ("hook_attn_out", "hook_mlp_out"))
    assert localize.silence_name("layer", 2) == "silence-layer-2"
    with pytest.raises(ValueError, match="component 'ffn' unknown; valid: 'mlp', 'attn', 'layer'"):
        localize.silence_component("ffn", 2)
    conditions = scripted(tmp_path, tiny_model, silencing_script)
    localize.selection_sweep(conditions, [1])
    stored = conditions.results.drop_duplicates("condition").set_index("condition").interventions
    assert sorted(stored.index) == ["silence-attn-1", "silence-mlp-1"]
    assert json.loads(stored["silence-mlp-1"]) == [Silence(1, "hook_mlp_out").to_dict()]


def test_a_resumed_condition_is_not_recomputed(tmp_path, tiny_model):
    conditions = scripted(tmp_path, tiny_model, silencing_script)
    conditions.run("silence-mlp-2", [Silence(2, "hook_mlp_out")], "calibration")
    again = scripted(tmp_path, tiny_model, silencing_script)  # a new process reading the same store
    again.run("silence-mlp-2", [Silence(2, "hook_mlp_out")], "calibration")
    again.run("silence-mlp-2", [Silence(2, "hook_mlp_out")], "evaluation", panels=("failure",))
    assert len(again.calls) == 1 and again.calls[0][1] == {"evaluation"}
    assert again.rates("silence-mlp-2", "calibration")["repair_k"] == 9


def steering_script(interventions, role, panel, index):
    """Rescue (negative alpha, failures): calibration best at alpha 8, evaluation best at 2. Induction (positive
    alpha, healthy): calibration best at alpha 2, evaluation best at 8."""
    (iv,) = interventions
    alpha = abs(iv.alpha)
    best = {("calibration", "failure"): 8, ("evaluation", "failure"): 2, ("calibration", "healthy"): 2,
            ("evaluation", "healthy"): 8}[(role, panel)]
    hits = 6 if alpha == best else 2
    return index < hits if panel == "failure" else index >= hits


def test_each_steering_direction_gets_its_own_dose_chosen_on_calibration(tmp_path, tiny_model):
    conditions = scripted(tmp_path, tiny_model, steering_script)
    table, doses = localize.steering(conditions, 1, torch.ones(tiny_model.cfg.d_model), [2.0, 4.0, 8.0])
    assert doses == {"rescue": 8.0, "induction": 2.0}
    for interventions, roles in conditions.calls:  # rescue runs on failures only, induction on healthy only
        assert isinstance(interventions[0], Steer) and len(roles) == 1
    ev = table[table.role == "evaluation"].set_index("alpha")
    assert ev.loc[8.0, "rescue"] == 0.2 and ev.loc[2.0, "rescue"] == 0.6 and ev.loc[2.0, "induction"] == 0.2
    assert set(table.role) == {"calibration", "evaluation", "random direction"}
    rand = table[table.role == "random direction"]  # the control: a random direction of v's norm at EVERY dose
    doses_measured = list(zip(rand.alpha, rand.rescue.notna(), rand.induction.notna()))
    assert doses_measured == [(2.0, True, True), (4.0, True, True), (8.0, True, True)]
    assert (rand.rescue_n == 10).all() and (rand.induction_n == 10).all()  # evaluation questions
    random_calls = [(ivs[0], roles) for ivs, roles in conditions.calls 
                    if not np.allclose(np.asarray(ivs[0].v.values), 1.0)]
    assert len(random_calls) == 6 and all(roles == {"evaluation"} for _, roles in random_calls)
    assert sorted(abs(iv.alpha) for iv, _ in random_calls) == [2.0, 2.0, 4.0, 4.0, 8.0, 8.0]
    steers = [iv for ivs, _ in conditions.calls for iv in ivs]
    assert all(iv.positions is None for iv in steers)  # added at every position, generated tokens included
    norms = {round(float(np.linalg.norm(iv.v.values)), 4) for iv in steers}
    assert norms == {round(float(np.sqrt(tiny_model.cfg.d_model)), 4)} and len({iv.v for iv in steers}) == 2


def study_script(interventions, role, panel, index):
    if interventions and isinstance(interventions[0], Steer):
        return steering_script(interventions, role, panel, index)
    return silencing_script(interventions, role, panel, index)


def scripted_study(tmp_path, tiny_model, **settings) -> localize.Study:
    """A whole study on scripted answers; failures 0 and 1 of calibration and failure 0 of evaluation gave greedy
    answers no letter was read from."""
    conditions = scripted(tmp_path, tiny_model, study_script)
    screened = pd.DataFrame([{"question_id": q.id, "recognized": q.id.startswith("failure"),
                              "generated": q.id.startswith("healthy"),
                              "gen_format_ok": q.id not in ("failure-calibration-0", "failure-calibration-1",
                                                            "failure-evaluation-0")}
                             for q in conditions.by_id.values()])
    sweep = localize.selection_sweep(conditions, [0, 1, 2])
    table, margins, verdict = localize.evaluate_choice(conditions, sweep, 2, "net", top=2)
    steering, doses = localize.steering(conditions, 2, torch.ones(tiny_model.cfg.d_model), [2.0, 4.0, 8.0])
    units = unit_rows(n=10).assign(space="MLP units", units=[[], [1, 2], [3, 4], [5, 6], [7, 8]], repair_lo=0.0,
                                   repair_hi=1.0)
    settings = {"task": "arc_easy", "fmt": "native", "recognition": "sum", "healthy_rule": "already-correct",
                "calibration_share": 0.5, "max_calibration": 10, "max_eval": 10, "layer_rule": "net", "unit_k": 2,
                "unit_rank": "contribution", "exclude_format_failures": False, **settings}
    v_info = {"layer": 2, "n_failure": 10, "n_healthy": 10, "norm": 1.0, "mlp_out_norm": 2.0, "mean_abs_cosine": 0.1}
    return localize.Study(tag="t", settings=settings, screened=screened, panels=conditions.panels,
                          eligible={"failure": 20, "healthy": 20}, sweep=sweep, layer=2, evaluation=table,
                          margins=margins, verdict=verdict, baseline=localize.baseline_check(conditions),
                          v_info=v_info, steering=steering, doses=doses, units=units)


def test_summary_says_where_v_is_measured_and_added_and_what_the_random_direction_did_at_each_dose(
        tmp_path, tiny_model):
    text = localize.summary(scripted_study(tmp_path, tiny_model))
    steering = text[text.index("## Steering"):text.index("## Top-")]
    assert "v is measured at the last prompt token only" in steering
    assert "added to the output of MLP 2 at every position, each prompt token and each generated token" in steering
    assert "rescue, random direction" in steering and "induction, random direction" in steering
    rows = [line for line in steering.splitlines() if line.startswith(("| 2 ", "| 4 ", "| 8 "))]
    assert len(rows) == 3 and all(row.count("/10;") == 6 for row in rows)  # six measured rates at every alpha


def test_summary_counts_unparseable_greedy_answers_in_the_failure_set_and_names_the_unit_rule(tmp_path, tiny_model):
    text = localize.summary(scripted_study(tmp_path, tiny_model))
    assert ("Unparseable greedy answers (no letter read) among the failures: 3 of the 20 eligible, 2 calibration + "
            "1 evaluation") in text
    assert "Ranked by mean contribution on the calibration failures" in text and "rule 'contribution'" in text
    text = localize.summary(scripted_study(tmp_path / "w", tiny_model, unit_rank="weights",
                                           exclude_format_failures=True))
    assert "Ranked by output weights alone" in text
    assert "3 recognized questions, left out of the failure set (--exclude-format-failures)" in text


def unit_rows(block_k=8, top_k=6, random_k=(1, 0, 2), n=10):
    rows = [{"arm": "block", "repair_k": block_k}, {"arm": "top", "repair_k": top_k}]
    rows += [{"arm": "random", "repair_k": k} for k in random_k]
    df = pd.DataFrame(rows).assign(repair_n=n, mass=[1.0, 0.2, 0.02, 0.03, 0.025])
    df["repair"] = df.repair_k / n
    df["repair_vs_block"] = df.repair / (block_k / n) if block_k else np.nan
    return df


def test_units_figure_normalizes_by_the_block_with_random_sd_bars_and_n_labels():
    fig = plots.plot_units_vs_block(unit_rows())
    left, right = fig.axes
    heights = [p.get_height() for p in left.patches]
    assert heights == pytest.approx([6 / 8, np.mean([1, 0, 2]) / 8])
    (bars,) = [c for c in left.containers if hasattr(c, "errorbar") and c.errorbar is not None]
    segments = bars.errorbar.lines[2][0].get_segments()
    assert segments[1][1][1] - segments[1][0][1] == pytest.approx(2 * np.std([1, 0, 2], ddof=1) / 8)
    labels = [t.get_text() for t in left.texts]
    assert labels == ["n = 10\n(6 repaired)", "n = 10 x 3 sets\n(mean 1.0 repaired)"]
    assert "relative to the whole block" in left.get_ylabel() and "8/10" in fig._suptitle.get_text()
    assert [p.get_height() for p in right.patches] == pytest.approx([0.2, 0.025])
    raw = plots.plot_units_vs_block(unit_rows(block_k=0, top_k=0, random_k=(0, 0, 1))).axes[0]
    assert "not normalized" in raw.get_ylabel() and raw.patches[1].get_height() == pytest.approx(1 / 30)


def test_layer_sweep_figure_marks_runner_ups_and_the_evaluation_points():
    rates = {"repair": 0.5, "repair_lo": 0.3, "repair_hi": 0.7, "repair_n": 10, "breakage": 0.1, "breakage_lo": 0.0,
             "breakage_hi": 0.4, "breakage_n": 8}
    sweep = pd.DataFrame([{"layer": l, "component": c, **rates} for l in range(4) for c in ("mlp", "attn")])
    evaluation = pd.DataFrame([{"layer": 2, "component": c, **rates, "repair_n": 12} for c in ("mlp", "attn", "layer")])
    marks = [("attn", 3, "best component"), ("mlp", 0, "best other MLP")]
    fig = plots.plot_layer_sweep(sweep, marked_layer=2, title="t", runner_ups=marks, evaluation=evaluation)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "R1: attn 3 (best component)" in legend and "R2: mlp 0 (best other MLP)" in legend
    assert any("evaluation split (n_fail = 12, n_healthy = 8)" in t for t in legend)
    assert "calibration n_fail = 10, n_healthy = 8" in fig._suptitle.get_text()
