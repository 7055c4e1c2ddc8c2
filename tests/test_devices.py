"""Device and dtype discipline of the engine and probes: nothing is created on an implicit device, and bfloat16
runs end to end (its greedy agreement with float32 is reported and bounded below)."""
import pytest
import torch
from conftest import make_tiny_model

from reach_lens.generate import LoglikRequest, Request, TransformerLensEngine, engine_for
from reach_lens.interventions import Silence, Steer


def random_prompts(n, seed=0, d_vocab=50):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 30, (n,), generator=g).tolist()
    return [tuple(torch.randint(0, d_vocab, (k,), generator=g).tolist()) for k in lengths]


def test_every_tensor_follows_the_model_not_the_default_device():
    """With torch's default device set to ``meta`` while the model sits on the CPU, any tensor the engine made
    without naming a device would be a meta tensor and the call would fail (or give meta results)."""
    model = make_tiny_model()
    requests = [Request((1, 2, 3, 4), 5, route=(0, 1, 1, 3)), Request((5, 6), 5, temperature=0.7, seed=1),
                Request((7, 8, 9), 4, keep_hidden=True)]
    ivs = [Steer(1, tuple([0.1] * model.cfg.d_model), 2.0, positions=(-1, 6)), Silence(2, "hook_mlp_out")]
    expected = [engine_for(model).generate(requests, interventions=i, batch_size=2) for i in ((), ivs)]
    expected_ll = engine_for(model).loglik([LoglikRequest((1, 2), (3, 4))])
    torch.set_default_device("meta")
    try:
        got = [TransformerLensEngine(model).generate(requests, interventions=i, batch_size=2) for i in ((), ivs)]
        got_ll = TransformerLensEngine(model).loglik([LoglikRequest((1, 2), (3, 4))])
    finally:
        torch.set_default_device(None)
    for e, g in zip(expected, got):
        assert [x.tokens for x in g] == [x.tokens for x in e]
        assert all(x.hidden is None or x.hidden.device.type == "cpu" for x in g)
    assert got_ll == pytest.approx(expected_ll)


def test_bfloat16_end_to_end_agrees_with_float32():
    """bfloat16 weights and caches through prefill, routes, hooks and sampling. Greedy agreement with float32 on
    60 random prompts of a tiny random model (weights scaled up, so logits are far from the embedded model's):
    measured 0.90 on the first token and 0.55 on whole 8-token continuations; the floor is 0.75 on the first."""
    fp32 = make_tiny_model()
    bf16 = make_tiny_model().to(torch.bfloat16)
    assert bf16.cfg.dtype == torch.bfloat16
    prompts = random_prompts(60)
    requests = [Request(p, 8, stop_token_ids=()) for p in prompts]
    a = TransformerLensEngine(fp32).generate(requests)
    b = TransformerLensEngine(bf16).generate(requests)
    first = sum(x.tokens[0] == y.tokens[0] for x, y in zip(a, b)) / len(a)
    whole = sum(x.tokens == y.tokens for x, y in zip(a, b)) / len(a)
    print(f"bfloat16 vs float32 greedy agreement: first token {first:.2f}, whole continuation {whole:.2f}")
    assert first >= 0.75
    routed = TransformerLensEngine(bf16).generate(
        [Request(prompts[0], 4, route=(0, 2, 2, 3), temperature=0.8, seed=3, keep_hidden=True)],
        interventions=[Silence(1, "hook_attn_out")])[0]
    assert len(routed.tokens) >= 1 and routed.hidden.dtype == torch.float32
    assert all(torch.isfinite(torch.tensor(routed.token_logprobs)))
    ll = TransformerLensEngine(bf16).loglik([LoglikRequest(prompts[1][:-2], prompts[1][-2:])])
    ref = TransformerLensEngine(fp32).loglik([LoglikRequest(prompts[1][:-2], prompts[1][-2:])])
    assert ll[0] == pytest.approx(ref[0], abs=0.5)


def test_place_on_devices_puts_blocks_in_pipeline_order_and_the_engine_follows_them():
    """On this CPU machine every device is the CPU: the placement arithmetic and the engine's per-block moves run,
    and nothing changes the results."""
    from reach_lens.models import place_on_devices

    model = make_tiny_model()
    requests = [Request((1, 2, 3), 5, route=(0, 2, 2, 3)), Request((4, 5), 5)]
    before = TransformerLensEngine(model).generate(requests)
    devices = [torch.device("cpu")] * 3
    place_on_devices(model, devices)
    assert model.cfg.n_devices == 3
    after = TransformerLensEngine(model).generate(requests)
    assert [g.tokens for g in after] == [g.tokens for g in before]
    with pytest.raises(ValueError, match="n_devices=2 needs 2 CUDA devices"):
        from reach_lens.models import load_model

        load_model("/nonexistent", n_devices=2, device="cpu")


def test_decode_batches_adapt_to_free_gpu_memory(monkeypatch):
    """On a CUDA model the decode batch is what fits in half the free memory (capped by --batch-size, at least 1);
    elsewhere it is the cap. A stand-in model says it is on cuda, and mem_get_info reports the free memory."""
    from types import SimpleNamespace

    from reach_lens.generate.attention import rows_that_fit

    model = make_tiny_model()
    cfg = model.cfg
    on_gpu = SimpleNamespace(cfg=cfg, embed=SimpleNamespace(W_E=SimpleNamespace(device=torch.device("cuda"))))
    per_row = 2 * 4 * 100 * cfg.n_key_value_heads * cfg.d_head * 4 + 4 * (cfg.d_vocab + 4 * cfg.d_model)  # K and V: 4 slots, 100 columns, fp32
    for free, expected in ((10 * per_row, 5), (per_row // 3, 1), (10**12, 64)):
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device, free=free: (free, 2 * free))
        assert rows_that_fit(on_gpu, slots=4, capacity=100, cap=64) == expected
    assert rows_that_fit(model, slots=4, capacity=100, cap=64) == 64  # a CPU model: the cap
