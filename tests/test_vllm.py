"""The vLLM engine's conversion of vLLM outputs into Generations and log-likelihoods. vLLM needs a GPU and is not
installed by CI: the conversion is tested on stand-in objects shaped like vLLM's outputs always, and on vLLM's own
output types when vLLM is importable; the engine itself runs in bench/gpu_check.py on a GPU machine."""
import math
from types import SimpleNamespace

import pytest

from reach_lens.generate import EngineCapabilityError, LoglikRequest, Request
from reach_lens.generate.vllm_engine import VLLMEngine, generation_from_vllm, loglik_from_vllm


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
    outputs = pytest.importorskip("vllm.outputs", reason="vLLM is not installed (GPU machines only: reach_lens[vllm])")
    logprobs = pytest.importorskip("vllm.logprobs")
    check_conversion(make=outputs.CompletionOutput, logprob=lambda lp: logprobs.Logprob(logprob=lp))


def test_the_engine_refuses_hooks_routes_and_hidden_states():
    engine = VLLMEngine.__new__(VLLMEngine)  # no vLLM needed to check capabilities
    with pytest.raises(EngineCapabilityError, match="cannot run hooks"):
        engine.check([Request((1,), 2)], hooks=[("blocks.0.hook_mlp_out", lambda a, hook: a)])
    with pytest.raises(EngineCapabilityError, match="route"):
        engine.check([Request((1,), 2, route=(0, 1))])
    with pytest.raises(EngineCapabilityError, match="hidden states"):
        engine.check([Request((1,), 2, keep_hidden=True)])
