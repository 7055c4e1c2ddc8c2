"""The selective positive control on the embedded model: a rank-1 unit plant that only part of the pool triggers
is identified at two depths, repairs more failures than every runner-up (with a paired 95% interval above 0
over the attention of its own layer), and its units are among the top units along v. One base screen serves
both depths; a subset of layers and 200 questions keep the cost small, so the margins over upstream blocks
that compute the trigger (14 evaluation failures here) are asserted as point estimates; the full-size runs
(README) give their intervals."""
import pytest

from reach_lens import localize
from reach_lens.models import load_model
from reach_lens.protocol import Protocol
from reach_lens.store import RunStore
from reach_lens.tasks import get_task, subsample

DEPTHS = (12, 20)
N = 200


@pytest.fixture(scope="module")
def embedded():
    model = load_model()
    task = get_task("piqa")
    questions = subsample(task.load(), N, 0)
    return model, task, questions, localize.screen(model, task, questions, "native")


@pytest.mark.integration
@pytest.mark.parametrize("depth", DEPTHS)
def test_selective_unit_plant_is_found_with_a_margin_over_every_swept_component(embedded, depth, tmp_path):
    model, task, questions, base = embedded
    store = RunStore(tmp_path, Protocol.of(study="test-control", model=model, task=task, questions=questions,
                                           fmt="native", probe="screen", settings={"depth": depth}))
    pool, _ = localize.control_pool(model, task, questions, base, "native", depth, store)
    planted, info = localize.plant_control("units", model, task, pool, "native", depth, store, units_k=8)
    assert info["flip_measured"] >= 0.5
    screened = localize.screen(planted, task, pool, "native")
    panels = localize.build_panels(screened, seed=0, max_evaluation=16, max_calibration=16)
    localize.check_panels(panels, minimum=6)
    conditions = localize.Conditions(planted, task, "native", store, panels, pool)
    layers = sorted({depth - 1, depth, depth + 1, 4, 16, 28})
    sweep = localize.selection_sweep(conditions, layers)
    assert localize.identify_layer(sweep, "net") == depth
    table, margins, verdict = localize.evaluate_choice(conditions, sweep, depth, "net", top=3)
    assert (margins["diff"] > 0).all(), margins  # repairs more than every runner-up
    assert margins.set_index("name").loc[f"attention {depth}", "lo"] > 0, margins
    assert verdict["selective"] and not verdict["beaten_by"], verdict["text"]
    v, _ = localize.mlp_direction(planted, depth, localize.calibration_prompts(conditions, "failure"),
                                  localize.calibration_prompts(conditions, "healthy"))
    from reach_lens.hooks import top_units_along
    assert set(info["units"]) <= set(top_units_along(planted, depth, v, 32))  # the top-32 step's known answer
