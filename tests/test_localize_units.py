"""The units step's ranking rules on a tiny random model: the contribution rule (mean activation on the calibration
failures x W_out[u] . v/|v|) and the weight-only rule, with a unit whose activation is negative there."""
import pandas as pd
import pytest
import torch
from conftest import make_tiny_model
from test_localize_steps import Scripted
from test_probes import CharTokenizer

from reach_lens import localize
from reach_lens.interventions import Units
from reach_lens.protocol import Protocol
from reach_lens.store import RunStore
from reach_lens.tasks import Question, get_task
from reach_lens.generate import engine_for
from reach_lens.unit_selection import top_units_along

LAYER, K = 2, 4


def test_the_contribution_rule_weighs_each_unit_by_its_mean_activation():
    writes = torch.tensor([[3.0, 0.0], [2.0, 0.0], [1.0, 0.0], [0.0, 5.0]])  # units' output rows, d_model 2
    v = torch.tensor([2.0, 0.0])
    acts = torch.tensor([[-1.0, 1.0, 2.0, 9.0], [-3.0, 1.0, 2.0, 9.0]])  # unit 0 is negative on both failures
    weights = localize.unit_scores(writes, v, "weights")
    assert weights.tolist() == [3.0, 2.0, 1.0, 0.0]
    contribution = localize.unit_scores(writes, v, "contribution", acts)
    assert contribution.tolist() == [-6.0, 2.0, 2.0, 0.0]  # mean activation x w_u . v/|v|
    assert localize.top_units(weights, 2) == [0, 1]
    assert localize.top_units(contribution, 2) == [1, 2]  # ties by id; unit 0 pushes against v: last
    with pytest.raises(ValueError, match="needs activations"):
        localize.unit_scores(writes, v, "contribution")
    with pytest.raises(ValueError, match="unit rank rule 'mass' unknown"):
        localize.unit_scores(writes, v, "mass", acts)


@pytest.fixture
def conditions(tmp_path):
    """Scripted answers (silencing more repairs more) on a tiny model with a tokenizer: the unit step reads real
    activations, the answers need no decoding."""
    model = make_tiny_model(d_vocab=100)
    model.tokenizer = CharTokenizer()
    words = ["Which is hot", "Bees make", "Sky colour", "Grass is", "Snow is", "Fire is", "Rain falls", "Sun rises"]
    questions = [Question(f"{p}-{r}-{i}", f"{words[i]} ({p} {r})?", "A", ("x", "y"), ("A", "B"))
                 for p in ("failure", "healthy") for r in ("calibration", "evaluation") for i in range(8)]
    panels = pd.DataFrame([{"question_id": q.id, "panel": q.id.split("-")[0], "role": q.id.split("-")[1]}
                           for q in questions])

    def script(interventions, role, panel, index):
        silenced = len(interventions[0].units) if isinstance(interventions[0], Units) else model.cfg.d_mlp
        return panel == "healthy" or index < 8 * silenced / model.cfg.d_mlp

    task = get_task("arc_easy")
    store = RunStore(tmp_path / "run", Protocol.of(study="test", facts=engine_for(model).describe(), task=task,
                                                    questions=questions, fmt="shared", probe="screen"))
    return Scripted(script, model, task, "shared", store, panels, questions)


def test_a_unit_pushing_against_v_on_the_failures_is_top_by_weights_but_not_by_contribution(conditions):
    model = conditions.model
    prompts = [conditions.task.prompt(q, "shared", model.tokenizer) for q in conditions.questions("calibration",
                                                                                                  ("failure",))]
    acts = localize.last_prompt_activations(model, prompts, f"blocks.{LAYER}.mlp.hook_post")
    negative = int(acts.mean(0).argmin())
    assert float(acts.mean(0)[negative]) < 0  # SwiGLU units can be negative where v is measured
    v = torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # its output weights point along v more than any other unit's (its activation is upstream)
        model.blocks[LAYER].mlp.W_out[negative] = 10 * v / v.norm()

    by_weights = localize.unit_arms(conditions, LAYER, v, K, seeds=2, rank="weights")
    by_contribution = localize.unit_arms(conditions, LAYER, v, K, seeds=2, rank="contribution")
    top_w = by_weights[by_weights.arm == "top"].iloc[0]
    top_c = by_contribution[by_contribution.arm == "top"].iloc[0]
    assert top_w.units == top_units_along(model, LAYER, v, K) and top_w.units[0] == negative
    assert negative not in top_c.units
    along = model.blocks[LAYER].mlp.W_out.detach() @ (v / v.norm())
    assert top_c.units == torch.argsort(acts.mean(0) * along, descending=True, stable=True)[:K].tolist()
    assert top_c.score > 0 > float(acts.mean(0)[negative] * along[negative])
    assert set(by_weights["rank"]) == {"weights"} and set(by_contribution["rank"]) == {"contribution"}
    for table in (by_weights, by_contribution):  # random sets avoid their own rule's top set
        top = set(table[table.arm == "top"].iloc[0].units)
        assert all(not top & set(r.units) for r in table[table.arm == "random"].itertuples())
    # the rules' arms are separate conditions in one store (their random sets differ too)
    names = set(conditions.results.condition)
    assert {f"units-weights-top{K}-L{LAYER}", f"units-contribution-top{K}-L{LAYER}"} <= names
