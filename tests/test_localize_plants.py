"""The planted failures of the positive controls, on tiny random models: what they edit, that the search hooks
equal the edit, and that the unit plant gives steering and the top units a known answer."""
import torch

from reach_lens import localize
from reach_lens.interventions import Silence, hooks_for
from reach_lens.unit_selection import top_units_along


def test_trigger_units_find_units_that_fire_together_on_part_of_the_pool():
    g = torch.Generator().manual_seed(0)
    acts = 0.1 * torch.randn(40, 64, generator=g)
    on = torch.arange(40) % 3 == 0  # 14 of 40 questions trigger the feature
    acts[on.nonzero(), torch.tensor([3, 7, 11])] += torch.tensor([5.0, 2.0, 3.0])
    acts[:, 20] += 3.0 * torch.randn(40, generator=g)  # a large but unimodal unit must not be taken
    found = localize.trigger_units(acts, k=3, share=14 / 40)
    assert found["units"] == [3, 7, 11] and found["seed"] == 3
    assert torch.equal(found["triggered"], on)
    assert abs(float(found["score"][on].mean()) - 1.0) < 1e-4 and float(found["score"][~on].abs().max()) < 0.2
    # unit 7 loses its firing when an upstream block is silenced: a robust trigger leaves it out
    fragile = acts.clone()
    fragile[:, 7] = 0.1 * torch.randn(40, generator=g)
    robust = localize.trigger_units(acts, k=2, share=14 / 40, perturbed=[fragile])
    assert robust["units"] == [3, 11]


def test_unit_plant_is_a_rank_one_edit_of_those_units_and_its_intervention_equals_it(tiny_model):
    layer, units = 2, [5, 9, 30]
    weights, push = torch.tensor([0.5, 1.0, 2.0]), torch.randn(tiny_model.cfg.d_model)
    planted = localize.plant_unit_failure(tiny_model, layer, units, weights, push, strength=3.0)
    changed = {n for n, p in planted.state_dict().items() if not torch.equal(p, tiny_model.state_dict()[n])}
    assert changed == {f"blocks.{layer}.mlp.W_out"}
    delta = planted.blocks[layer].mlp.W_out - tiny_model.blocks[layer].mlp.W_out
    assert torch.linalg.matrix_rank(delta) == 1 and set(delta.abs().sum(1).nonzero().flatten().tolist()) == set(units)
    tokens = torch.randint(0, 50, (3, 7))
    with torch.no_grad():
        plant = localize.UnitPlant(layer, units, weights, push, 3.0)
        with tiny_model.hooks(fwd_hooks=hooks_for([plant], tiny_model)):
            hooked = tiny_model(tokens)
        assert torch.allclose(hooked, planted(tokens), atol=1e-4)
        assert not torch.allclose(planted(tokens), tiny_model(tokens), atol=1e-2)
        with planted.hooks(fwd_hooks=hooks_for([Silence(layer, "hook_mlp_out")], planted)):
            planted_silenced = planted(tokens)
        with tiny_model.hooks(fwd_hooks=hooks_for([Silence(layer, "hook_mlp_out")], tiny_model)):
            assert torch.allclose(planted_silenced, tiny_model(tokens), atol=1e-5)  # silencing the block removes it


def test_unit_plant_gives_the_direction_and_the_top_units_their_known_answer(tiny_model):
    """v (triggered minus untriggered mean MLP output) of the planted model points along the push, and the
    top units along v include every planted unit: the answer the study's steering and unit steps must find."""
    layer, k = 2, 4
    torch.manual_seed(1)
    tokens = torch.randint(0, 50, (64, 6))
    with torch.no_grad():
        _, cache = tiny_model.run_with_cache(tokens, names_filter=[f"blocks.{layer}.mlp.hook_post"])
    trigger = localize.trigger_units(cache[f"blocks.{layer}.mlp.hook_post"][:, -1], k, share=0.5)
    push = torch.randn(tiny_model.cfg.d_model)
    planted = localize.plant_unit_failure(tiny_model, layer, trigger["units"], trigger["weights"], push, 50.0)
    with torch.no_grad():
        _, cache = planted.run_with_cache(tokens, names_filter=[f"blocks.{layer}.hook_mlp_out"])
    out = cache[f"blocks.{layer}.hook_mlp_out"][:, -1]
    v = out[trigger["triggered"]].mean(0) - out[~trigger["triggered"]].mean(0)
    assert torch.nn.functional.cosine_similarity(v, push, dim=0) > 0.9
    assert set(trigger["units"]) <= set(top_units_along(planted, layer, v, 2 * k))
