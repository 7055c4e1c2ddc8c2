"""The MLP-localization building blocks on tiny random models and hand-made tables."""
import numpy as np
import pandas as pd
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast
from transformer_lens import HookedTransformer

from conftest import tiny_config
from reach_lens import localize
from reach_lens.hooks import LAYER_OUTPUTS
from reach_lens.interventions import Route, Silence, Steer, hooks_for
from reach_lens.models import encode


@pytest.fixture
def worded_model(tmp_path) -> HookedTransformer:
    """A tiny random model with a whitespace word-level tokenizer (so text-level helpers run)."""
    vocab = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(47)]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                  pad_token="</s>")
    tok.save_pretrained(tmp_path)  # TransformerLens re-loads tokenizers by name
    tok = AutoTokenizer.from_pretrained(tmp_path)
    torch.manual_seed(0)
    model = HookedTransformer(tiny_config(d_vocab=len(vocab)), tokenizer=tok, default_padding_side="right")
    model.cfg.default_prepend_bos = False
    return model.eval()


def screened_table(n: int = 200, seed: int = 1) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"question_id": [f"q{i}" for i in range(n)], "recognized": rng.random(n) < 0.6,
                         "generated": rng.random(n) < 0.4})


def test_a_screen_for_a_pool_recognizes_only_the_generated_questions(monkeypatch):
    """recognize="generated": the greedy answers of every question, recognition only of those answered correctly
    (a positive control's pool needs both); the other rows say recognition was not measured."""
    from reach_lens.tasks import Question, get_task

    task = get_task("arc_easy")
    questions = [Question(f"q{i}", f"question {i}?", "A", options=("a", "b"), labels=("A", "B")) for i in range(5)]
    correct = {"q0", "q2", "q3"}
    recognized_ids = []

    def deploy(model, task, qs, fmt, interventions=(), batch_size=16):
        return [{"correct": q.id in correct, "answer": "A" if q.id in correct else "B", "text": "x"} for q in qs]

    def recognize(model, task, qs, interventions=(), batch_size=16):
        recognized_ids.extend(q.id for q in qs)
        return [{"question_id": q.id, "pred_sum": 0 if q.id != "q3" else 1, "pred_norm": 0} for q in qs]

    monkeypatch.setattr(localize.panels.probes, "deploy", deploy)
    monkeypatch.setattr(localize.panels.probes, "recognize", recognize)
    rows = localize.screen(None, task, questions, "native", recognize="generated").set_index("question_id")
    assert recognized_ids == ["q0", "q2", "q3"]
    assert rows.recognized.to_dict() == {"q0": True, "q1": None, "q2": True, "q3": False, "q4": None}
    assert rows.generated.tolist() == [True, False, True, True, False]
    recognized_ids.clear()
    assert localize.screen(None, task, questions, "native").recognized.tolist() == [True] * 3 + [False, True]
    assert recognized_ids == [q.id for q in questions]
    with pytest.raises(ValueError, match="recognize 'some' unknown"):
        localize.screen(None, task, questions, "native", recognize="some")


def test_panels_follow_the_criterion_and_are_disjoint():
    screened = screened_table()
    by_id = screened.set_index("question_id")
    for rule in localize.HEALTHY_RULES:
        panels = localize.build_panels(screened, seed=0, healthy_rule=rule)
        for row in panels.itertuples():
            rec, gen = by_id.loc[row.question_id, ["recognized", "generated"]]
            if row.panel == "failure":
                assert rec and not gen
            else:
                assert gen and (rec or rule == "already-correct")
        assert panels.question_id.is_unique  # a question is in one panel and one role only
        failure = set(screened.question_id[screened.recognized & ~screened.generated])
        assert set(panels.question_id[panels.panel == "failure"]) == failure
        assert {"calibration", "evaluation"} <= set(panels.role)


def test_healthy_panel_defaults_to_the_papers_already_correct_questions():
    screened = screened_table()
    generated_only = set(screened.question_id[screened.generated & ~screened.recognized])
    assert generated_only  # the table has questions generated correctly but not recognized
    default = localize.build_panels(screened, seed=0)
    assert set(default.question_id[default.panel == "healthy"]) == set(screened.question_id[screened.generated])
    strict = localize.build_panels(screened, seed=0, healthy_rule="recognized-and-correct")
    assert not generated_only & set(strict.question_id[strict.panel == "healthy"])
    with pytest.raises(ValueError, match="healthy rule 'both'"):
        localize.build_panels(screened, seed=0, healthy_rule="both")


def test_format_failures_stay_in_the_failure_set_unless_excluded_and_are_counted():
    screened = screened_table()
    rng = np.random.default_rng(3)
    screened["gen_format_ok"] = screened.generated | (rng.random(len(screened)) < 0.7)  # a right answer was read
    failure = screened.recognized & ~screened.generated
    unread = set(screened.question_id[failure & ~screened.gen_format_ok])
    assert unread
    kept = localize.build_panels(screened, seed=0)
    assert unread <= set(kept.question_id[kept.panel == "failure"])  # wrong answers either way, by default
    assert localize.format_failures(screened, kept.question_id[kept.panel == "failure"]) == len(unread)
    dropped = localize.build_panels(screened, seed=0, exclude_format_failures=True)
    assert set(dropped.question_id[dropped.panel == "failure"]) == set(screened.question_id[failure]) - unread
    healthy = [p[p.panel == "healthy"].reset_index(drop=True) for p in (dropped, kept)]
    assert healthy[0].equals(healthy[1])  # a healthy answer was read: the rule never touches that panel
    masks = localize.panel_masks(screened, exclude_format_failures=True)
    assert int(masks["failure"].sum()) == int(failure.sum()) - len(unread)


def test_panel_caps_keep_the_lowest_hashes_of_each_split():
    screened = screened_table()
    full = localize.build_panels(screened, seed=2)
    capped = localize.build_panels(screened, seed=2, max_evaluation=7, max_calibration=5)
    sizes = localize.panel_sizes(capped)
    assert sizes == {(p, r): 7 if r == "evaluation" else 5 for p in ("failure", "healthy")
                     for r in ("calibration", "evaluation")}
    for (panel, role), group in capped.groupby(["panel", "role"]):
        kept = [localize.split_value(2, i) for i in group.question_id]
        everyone = set(full.question_id[(full.panel == panel) & (full.role == role)])
        dropped = [localize.split_value(2, i) for i in everyone - set(group.question_id)]
        assert max(kept) < min(dropped)


def test_too_small_panels_are_named_before_anything_runs():
    screened = screened_table().assign(generated=False)  # nobody answers correctly: no healthy question at all
    panels = localize.build_panels(screened, seed=0)
    with pytest.raises(localize.PanelTooSmall, match=r"healthy calibration: 0; healthy evaluation: 0 .*need >= 5"):
        localize.check_panels(panels, minimum=5)
    ok = localize.build_panels(screened_table(), seed=0, max_evaluation=6, max_calibration=6)
    localize.check_panels(ok, minimum=6)
    with pytest.raises(localize.PanelTooSmall, match="need >= 7"):
        localize.check_panels(ok, minimum=7)


def test_panel_rates_arithmetic():
    results = pd.DataFrame({"panel": ["failure"] * 4 + ["healthy"] * 5,
                            "correct": [True, False, True, False, True, True, False, True, True]})
    rates = localize.panel_rates(results)
    assert rates["repair"] == 0.5 and rates["repair_k"] == 2 and rates["repair_n"] == 4
    assert rates["breakage"] == 0.2 and rates["breakage_k"] == 1 and rates["breakage_n"] == 5
    assert rates["repair_lo"] < 0.5 < rates["repair_hi"]


def test_identified_layer_weighs_breakage_unless_the_paper_rule_is_asked():
    sweep = pd.DataFrame({"layer": [0, 1, 2, 0], "component": ["mlp", "mlp", "mlp", "attn"],
                          "repair": [0.9, 0.5, 0.5, 1.0], "breakage": [1.0, 0.1, 0.0, 0.0]})
    assert localize.identify_layer(sweep, "repair") == 0   # largest MLP repair, breaks every healthy answer
    assert localize.identify_layer(sweep, "net") == 2      # repair - breakage; attention rows never count
    assert localize.identify_layer(sweep.assign(breakage=0.1), "net") == 0
    with pytest.raises(ValueError, match="'biggest'"):
        localize.identify_layer(sweep, "biggest")
    with pytest.raises(ValueError, match="no MLP rows"):
        localize.identify_layer(sweep[sweep.component == "attn"])


def test_silencing_a_layer_the_forward_does_not_use_changes_nothing(tiny_model):
    tokens = torch.randint(0, 50, (3, 9))
    skip_two = Route((0, 1, 3))
    with torch.no_grad(), tiny_model.hooks(fwd_hooks=hooks_for([skip_two], tiny_model)):
        routed = tiny_model(tokens)
    with torch.no_grad(), tiny_model.hooks(fwd_hooks=hooks_for([skip_two, Silence(2, "hook_mlp_out")], tiny_model)):
        routed_and_silenced = tiny_model(tokens)
    assert torch.equal(routed, routed_and_silenced)
    with torch.no_grad(), tiny_model.hooks(fwd_hooks=hooks_for([Silence(3, LAYER_OUTPUTS)], tiny_model)):
        partial = tiny_model(tokens, stop_at_layer=3)
        whole = tiny_model(tokens)
    assert torch.equal(partial, tiny_model(tokens, stop_at_layer=3))
    assert not torch.allclose(whole, tiny_model(tokens))  # the same hooks act on a forward that runs layer 3
    with torch.no_grad(), tiny_model.hooks(fwd_hooks=hooks_for([Silence(2, LAYER_OUTPUTS)], tiny_model)):
        assert not torch.allclose(tiny_model(tokens, stop_at_layer=3), partial)  # and a layer it runs is silenced
    with torch.no_grad(), tiny_model.hooks(fwd_hooks=hooks_for([Silence(2, "hook_mlp_out")], tiny_model)):
        silenced = tiny_model(tokens)
    assert not torch.allclose(silenced, tiny_model(tokens))  # the same silencing acts where the layer runs


def test_last_prompt_logits_match_unpadded_forwards(worded_model):
    prompts = ["w1 w2 w3", "w4 w5 w6 w7 w8 w9", "w10"]
    batched = localize.last_prompt_logits(worded_model, prompts, batch_size=3)
    for prompt, row in zip(prompts, batched):
        alone = worded_model(torch.tensor([encode(worded_model, prompt)]))[0, -1]
        assert torch.allclose(row, alone, atol=1e-5)


def test_mlp_direction_is_the_mean_difference(worded_model):
    fail, healthy = ["w1 w2 w3", "w4 w5", "w6 w7 w8 w9"], ["w10 w11", "w12 w13 w14"]
    v, info = localize.mlp_direction(worded_model, 2, fail, healthy, batch_size=2)
    name = "blocks.2.hook_mlp_out"
    acts = {p: worded_model.run_with_cache(torch.tensor([encode(worded_model, p)]))[1][name][0, -1] for p in fail + healthy}
    raw = torch.stack([acts[p] for p in fail]).mean(0) - torch.stack([acts[p] for p in healthy]).mean(0)
    assert torch.allclose(v, raw, atol=1e-5)
    assert info["n_failure"] == 3 and info["n_healthy"] == 2
    with pytest.raises(ValueError, match="both panels"):
        localize.mlp_direction(worded_model, 2, fail, [])


def test_planted_edit_lives_only_in_that_mlp(worded_model):
    push = localize.answer_push(worded_model, target_token=7, away_from=[4, 5, 6])
    planted = localize.plant_answer_failure(worded_model, 2, push, strength=4.0)
    tokens = torch.tensor([encode(worded_model, "w1 w2 w3 w4")])
    changed = {n for n, p in planted.state_dict().items() if not torch.equal(p, worded_model.state_dict()[n])}
    assert changed == {"blocks.2.mlp.b_out"}
    before, after = worded_model(tokens)[0, -1], planted(tokens)[0, -1]
    assert (after[7] - after[4:7].mean()) > (before[7] - before[4:7].mean())  # pushes towards the target
    with worded_model.hooks(fwd_hooks=hooks_for([Steer(2, tuple(push.tolist()), 4.0)], worded_model)):
        steered = worded_model(tokens)[0, -1]
    assert torch.allclose(steered, after, atol=1e-4)  # the edit is steering at that MLP's output
    with worded_model.hooks(fwd_hooks=hooks_for([Silence(2, "hook_mlp_out")], worded_model)):
        base_silenced = worded_model(tokens)
    with planted.hooks(fwd_hooks=hooks_for([Silence(2, "hook_mlp_out")], planted)):
        planted_silenced = planted(tokens)
    assert torch.equal(base_silenced, planted_silenced)  # silencing the block removes the edit entirely
    with pytest.raises(ValueError, match="layer 9 out of range"):
        localize.plant_answer_failure(worded_model, 9, push, 1.0)


def test_perturbed_activations_equal_full_forwards_under_each_intervention(worded_model):
    prompts = ["w1 w2 w3", "w4 w5 w6 w7 w8 w9", "w10 w11"]
    perturbations = [Silence(1, "hook_attn_out"), Silence(2, "hook_mlp_out"), Silence(0, "hook_mlp_out"),
                     Silence(3, "hook_attn_out")]
    clean, fast = localize.perturbed_last_activations(worded_model, prompts, 3, perturbations, batch_size=2)
    for p, got in zip(perturbations, fast):
        full = localize.last_prompt_activations(worded_model, prompts, "blocks.3.mlp.hook_post", 2, [p])
        assert torch.allclose(got, full, atol=1e-5)
    one_by_one = torch.cat([localize.last_prompt_activations(worded_model, [p], "blocks.3.mlp.hook_post")
                            for p in prompts])  # no batching, no padding: prompt order
    assert torch.allclose(clean, one_by_one, atol=1e-5)
    assert not torch.allclose(fast[0], clean, atol=1e-3)  # the perturbation acted
    with pytest.raises(ValueError, match="acts after layer 2"):
        localize.perturbed_last_activations(worded_model, prompts, 2, [Silence(3, "hook_mlp_out")])


def test_activations_and_router_features_follow_the_model_not_the_default_device(worded_model):
    """With torch's default device set to ``meta`` (the model on the CPU), a tensor made without naming a device
    would be a meta tensor: these helpers must give the same results as under the ordinary default."""
    from reach_lens.routing.router import LayerRouter, prompt_features

    prompts = ["w1 w2 w3", "w4 w5 w6 w7 w8", "w9"]
    ids = [[1, 2, 3], [4, 5, 6, 7], [8]]

    def run():
        acts = localize.last_prompt_activations(worded_model, prompts, "blocks.1.hook_mlp_out")
        logits = localize.last_prompt_logits(worded_model, prompts)
        v, _ = localize.mlp_direction(worded_model, 2, prompts[:2], prompts[2:])
        features = prompt_features(worded_model, ids)
        labels = [[1] * 4, [0, 1, 1, 2], [1, 1, 0, 1]]  # skip / keep / repeat per layer
        routes = LayerRouter(seed=0).fit(features, labels).predict_routes(features)
        return acts, logits, v, features, routes

    expected = run()
    torch.set_default_device("meta")
    try:
        got = run()
    finally:
        torch.set_default_device(None)
    for e, g in zip(expected[:4], got[:4]):
        assert g.device.type == "cpu"
        torch.testing.assert_close(g, e)
    assert got[4] == expected[4]
