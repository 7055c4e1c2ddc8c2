"""The selective positive control on the embedded model: a rank-1 unit plant that only part of the pool triggers
is identified at MLP 12 among the components of the layers around it, repairs more failures than every runner-up
(with a paired 95% interval above 0 over the attention of its own layer), and its units are among the top units
along v. 200 questions, the layers next to the plant and the strength the search picks for this pool keep the
cost small (the search itself: ``test_the_strength_search_*``), so the margins over upstream blocks that compute
the trigger are asserted as point estimates; the full-size runs (docs/results.md: every layer, 400 questions, the
search, depths 12 and 20) give their intervals."""
import pytest

from reach_lens import localize
from reach_lens.localize.controls import _chosen, _enough
from reach_lens.protocol import Protocol
from reach_lens.store import RunStore
from reach_lens.tasks import get_task, subsample
from reach_lens.generate import engine_for
from reach_lens.unit_selection import top_units_along

N = 200
STRENGTH = {12: 2 ** 4.5}  # what plant_control's search picks on this pool (7 strengths tried); depth 20 (16.0) is
# the documented full-size run (docs/results.md)


@pytest.fixture(scope="module")
def piqa(embedded_model):
    """N PIQA questions and the unedited model's screen of them: the pool needs questions both generated and
    recognized, so recognition runs only on those generated (the same pool as a full screen, at about half the
    cost)."""
    task = get_task("piqa")
    questions = subsample(task.load(), N, 0)
    return task, questions, localize.screen(embedded_model, task, questions, "native", recognize="generated")


@pytest.mark.heavy(450)
@pytest.mark.integration
@pytest.mark.parametrize("depth", sorted(STRENGTH))
def test_selective_unit_plant_is_found_with_a_margin_over_every_swept_component(embedded_model, piqa, depth,
                                                                                 tmp_path):
    model, (task, questions, base) = embedded_model, piqa
    store = RunStore(tmp_path, Protocol.of(study="test-control", facts=engine_for(model).describe(), task=task,
                                           questions=questions, fmt="native", probe="screen", settings={"depth": depth}))
    pool, _ = localize.control_pool(model, task, questions, base, "native", depth, store)
    planted, info = localize.plant_control("units", model, task, pool, "native", depth, store, units_k=8,
                                           strength=STRENGTH[depth])
    assert info["flip_measured"] >= 0.5
    screened = localize.screen(planted, task, pool, "native")
    panels = localize.build_panels(screened, seed=0, max_evaluation=16, max_calibration=16)
    localize.check_panels(panels, minimum=6)
    conditions = localize.Conditions(planted, task, "native", store, panels, pool)
    sweep = localize.selection_sweep(conditions, [depth - 1, depth, depth + 1])
    assert localize.identify_layer(sweep, "net") == depth
    table, margins, verdict = localize.evaluate_choice(conditions, sweep, depth, "net", top=3)
    assert (margins["diff"] > 0).all(), margins  # repairs more than every runner-up
    assert margins.set_index("name").loc[f"attention {depth}", "lo"] > 0, margins
    assert verdict["selective"] and not verdict["beaten_by"], verdict["text"]
    v, _ = localize.mlp_direction(planted, depth, localize.calibration_prompts(conditions, "failure"),
                                  localize.calibration_prompts(conditions, "healthy"))
    assert set(info["units"]) <= set(top_units_along(planted, depth, v, 32))  # the top-32 step's known answer
    units = localize.unit_arms(conditions, depth, v, 32, seeds=1)  # by contribution on the calibration failures
    top = units[units.arm == "top"].iloc[0]
    assert set(info["units"]) <= set(top.units) and top.repair > units[units.arm == "random"].repair.max()


def steps(*flips):
    """Search steps (strength 1, 2, ...) with (failures among the measured, failures among the others)."""
    return [{"strength": float(i + 1), "flip_measured": m, "flip_others": o} for i, (m, o) in enumerate(flips)]


def test_the_strength_search_stops_and_chooses_as_documented():
    # bias push: the first strength that fails half the measured questions
    assert not _enough("bias", steps((0.2, None))) and _enough("bias", steps((0.2, None), (0.5, None)))
    assert _chosen("bias", steps((0.2, None), (0.6, None)))["strength"] == 2.0
    # unit plant: on while the selectivity (measured minus other failures) may grow
    tried = steps((0.3, 0.0), (0.6, 0.1), (0.8, 0.2), (0.85, 0.4), (0.9, 0.6))
    assert [_enough("units", tried[:k]) for k in range(1, 6)] == [False, False, False, False, True]
    assert _chosen("units", tried)["strength"] == 3.0  # the most selective of those failing >= half: 0.6
    assert _enough("units", steps((0.4, 0.0), (1.0, 0.3)))  # every measured question fails: stop
    tie = steps((0.6, 0.1), (0.7, 0.2))  # equal selectivity: the smaller strength
    assert _chosen("units", tie)["strength"] == 1.0
    assert _chosen("units", steps((0.1, 0.0), (0.3, 0.0)))["strength"] == 2.0  # none fails half: the last tried
