"""The engine interface, and its TransformerLens implementation.

    engine = engine_for(model)                                   # one per HookedTransformer, kept
    gens = engine.generate([Request(prompt, max_new_tokens=8)], interventions=[Silence(3, "hook_mlp_out")])
    scores = engine.loglik([LoglikRequest(context, continuation)])

An ``Engine`` turns ``Request``s into ``Generation``s and scores continuations (``loglik``), under the call's
interventions (``reach_lens.interventions``). ``TransformerLensEngine`` builds their hooks itself, with a
``PositionSource`` of the call on which it declares each batch row's positions around every forward
(``reach_lens.positions``), and registers them for the call only. A hook registered on the model by hand
(``with model.hooks(...)`` around the call) runs too, as hooks of no known kind (never ``positionwise``).

Hooks (interventions), routes and hidden states are capabilities: an engine that lacks one refuses a request
needing it (``EngineCapabilityError``). ``TransformerLensEngine`` has them all; a hook-free engine (vLLM) can
serve deploy and sample probes behind the same interface.
"""

from __future__ import annotations

import hashlib
import re
import weakref
from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from typing import ClassVar

import torch
from transformer_lens import HookedTransformer
from transformer_lens.utilities import apply_softcap

from reach_lens.generate.attention import fast_attention, fast_attention_supported
from reach_lens.generate.choice import check_finite
from reach_lens.generate.loop import DecodeLoop
from reach_lens.generate.loglik import padded_rows, shared_context_rows
from reach_lens.generate.prefill import Prefiller, PrefixCache
from reach_lens.generate.types import EngineCapabilityError, Generation, LoglikRequest, Request
from reach_lens.hooks import is_positionwise
from reach_lens.interventions import Intervention, hooks_for
from reach_lens.models import encode, model_fingerprint
from reach_lens.positions import PositionSource
from reach_lens.routes import validate_route

CAPABILITIES = ("hooks", "routes", "hidden", "entropy", "loglik")
CPU = torch.device("cpu")
_BLOCK = re.compile(r"^blocks\.(\d+)(\.|$)")


class Engine(ABC):
    """Generation and scoring behind one interface. ``name`` goes into every run's protocol."""

    name: ClassVar[str]
    capabilities: ClassVar[frozenset[str]]

    @property
    @abstractmethod
    def tokenizer(self):
        """The Hugging Face tokenizer of the model (prompts and completions are text)."""

    @abstractmethod
    def describe(self) -> dict:
        """What a run's protocol records of the model: ``model`` (name), ``weights`` (fingerprint), ``device``,
        ``dtype``."""

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` as the model reads a prompt (BOS only where the model's tokenizer adds one)."""

    @abstractmethod
    def generate(self, requests: Sequence[Request], interventions: Sequence[Intervention] = (),
                 batch_size: int = 16) -> list[Generation]:
        """One ``Generation`` per request, in order; ``interventions`` act for the whole call; ``batch_size`` caps
        the rows decoded together (on a GPU fewer when free memory is short)."""

    @abstractmethod
    def loglik(self, requests: Sequence[LoglikRequest], interventions: Sequence[Intervention] = (),
               batch_size: int = 32) -> list[float]:
        """The summed log-probability of each request's continuation after its context, under ``interventions``."""

    def close(self) -> None:
        """Free what the engine holds outside this process's Python objects (vLLM's engine process and its KV
        cache); nothing for an engine that holds nothing such. The engine is not used after."""

    def check(self, requests: Sequence[Request], interventions: Sequence[Intervention] = ()) -> None:
        """Refuse what this engine cannot do, naming the first request that needs it."""
        if interventions and "hooks" not in self.capabilities:
            raise EngineCapabilityError(f"engine {self.name!r} cannot run hooks ({len(interventions)} interventions "
                                        "given); use the transformer_lens engine for interventions")
        for i, r in enumerate(requests):
            if r.route is not None and "routes" not in self.capabilities:
                raise EngineCapabilityError(f"request {i} has route {list(r.route)}; engine {self.name!r} runs "
                                            "the full path only: use the transformer_lens engine for routes")
            if r.keep_hidden and "hidden" not in self.capabilities:
                raise EngineCapabilityError(f"request {i} asks for hidden states; engine {self.name!r} does not "
                                            "expose them")


class TransformerLensEngine(Engine):
    """Generation on a ``HookedTransformer`` with hooks, routes and hidden states (see ``reach_lens.generate``).

    ``prefix_cache_bytes`` bounds the clean prompt prefixes kept between calls (``prefill.PrefixCache``);
    ``share_prefixes=False`` computes every (prompt, route) prefill on its own, and ``decode_subsets=False`` runs
    every decode slot on the whole batch (``generate.loop``): references for tests and benchmarks.
    """

    name = "transformer_lens"
    capabilities = frozenset(CAPABILITIES)

    def __init__(self, model: HookedTransformer, prefix_cache_bytes: int = 2 << 30, share_prefixes: bool = True,
                 decode_subsets: bool = True, weak: bool = False):
        """``weak=True`` holds the model by a weak reference (``engine_for``'s engines must not keep their model
        alive: a study that loads checkpoint after checkpoint would keep every one of them in memory)."""
        self._model = weakref.ref(model) if weak else (lambda: model)
        self.share_prefixes, self.decode_subsets = share_prefixes, decode_subsets
        self.prefix_cache = PrefixCache(prefix_cache_bytes)

    @property
    def model(self) -> HookedTransformer:
        model = self._model()
        if model is None:
            raise ReferenceError("this engine's model no longer exists")
        return model

    @property
    def tokenizer(self):
        return self.model.tokenizer

    def encode(self, text: str) -> list[int]:
        return encode(self.model, text)

    def describe(self) -> dict:
        """The weights fingerprint covers attached SAEs too (their tensors, error-term setting and hook points)."""
        cfg = self.model.cfg
        weights = model_fingerprint(self.model)
        saes = attached_saes(self.model)
        if saes:
            digest = hashlib.sha256()
            for name, wrapper, sae in saes:
                digest.update(f"{name}|{bool(wrapper.use_error_term)}|{sae.cfg!r}".encode())
                for t in [*sae.parameters(), *sae.buffers()]:
                    digest.update(t.detach().float().cpu().numpy().tobytes())
            weights = f"{weights}+sae{digest.hexdigest()[:12]}"
        return {"model": cfg.model_name, "weights": weights, "device": str(cfg.device),
                "dtype": str(cfg.dtype).removeprefix("torch.")}

    @property
    def attention(self) -> str:
        """Which attention runs on the KV cache: ``"fast"`` (the engine's own, for the configurations it supports)
        or ``"transformer_lens"`` (TransformerLens's, on the same cache: sliding windows, alibi, learned positions,
        QK-norm over all heads, attention sinks, per-head results, ...)."""
        return "fast" if fast_attention_supported(self.model) else "transformer_lens"

    def clear_prefix_cache(self) -> None:
        """Forget the clean prompt prefixes (they are also dropped whenever the model's weights or modules change)."""
        self.prefix_cache.clear()

    # ---- generate -------------------------------------------------------------------------------

    def _validate(self, requests: Sequence[Request]) -> None:
        cfg = self.model.cfg
        for i, r in enumerate(requests):
            bad = [t for t in r.prompt if not 0 <= t < cfg.d_vocab]
            if bad:
                raise ValueError(f"request {i}: token id {bad[0]} out of range for vocabulary size {cfg.d_vocab} "
                                 f"(0..{cfg.d_vocab - 1})")
            if len(r.prompt) + r.max_new_tokens > cfg.n_ctx:
                raise ValueError(f"request {i}: prompt of {len(r.prompt)} tokens + max_new_tokens "
                                 f"{r.max_new_tokens} exceeds the model's context n_ctx={cfg.n_ctx}")
            if r.route is not None:
                validate_route(r.route, cfg.n_layers)

    def generate(self, requests: Sequence[Request], interventions: Sequence[Intervention] = (),
                 batch_size: int = 16) -> list[Generation]:
        requests = list(requests)
        if batch_size < 1:
            raise ValueError(f"batch_size {batch_size} out of range: expected >= 1")
        self.check(requests, interventions)
        self._validate(requests)
        source = PositionSource()
        hooks = hooks_for(interventions, self.model, source)
        if not requests:
            return []
        tokenizer = self.model.tokenizer
        decode = None if tokenizer is None else (lambda ids: tokenizer.decode(ids, skip_special_tokens=True))
        eos = () if getattr(tokenizer, "eos_token_id", None) is None else (tokenizer.eos_token_id,)
        fast = fast_attention_supported(self.model)
        # prompts' full paths are batched, and a shared token prefix runs once under the hooks, only when every hook
        # that runs is this call's and positionwise (or none runs)
        positionwise = all(is_positionwise(fn) for _, fn in hooks) and not hooks_registered(self.model)
        with torch.no_grad(), self.model.hooks(fwd_hooks=hooks), fast_attention(self.model, fast):
            hooked_from = first_hooked_layer(self.model)
            self.prefix_cache.validate(self._stamp(fast))
            prefiller = Prefiller(self.model, source, self.prefix_cache if self.share_prefixes else None, hooked_from,
                                  share=self.share_prefixes, positionwise_hooks=positionwise)
            prefiller.share_common_prefix([r.prompt for r in requests])
            return DecodeLoop(self.model, source, requests, prefiller, decode, eos, batch_size,
                              subsets=self.decode_subsets).run()

    def _stamp(self, fast: bool) -> Hashable:
        """What the clean prefixes depend on besides the prompt: parameters (storage and in-place versions),
        modules (weak references: equal only to the same live module, so a module made at a freed one's address
        does not pass for it), the attention implementation (rotated keys or not), and every SAE spliced in at a
        hook point (``attached_saes``: its tensors, ``use_error_term`` and config, which live outside the
        model's parameters)."""
        model = self.model
        params = tuple((p.data_ptr(), p._version) for p in model.parameters())
        modules = tuple(weakref.ref(m) for m in model.modules())
        saes = []
        for name, wrapper, sae in attached_saes(model):
            tensors = tuple((t.data_ptr(), t._version) for t in [*sae.parameters(), *sae.buffers()])
            saes.append((name, weakref.ref(sae), bool(wrapper.use_error_term), repr(sae.cfg), tensors))
        return hash((params, fast, str(model.cfg.dtype))), modules, tuple(saes)

    # ---- loglik ---------------------------------------------------------------------------------

    def loglik(self, requests: Sequence[LoglikRequest], interventions: Sequence[Intervention] = (),
               batch_size: int = 32) -> list[float]:
        """Summed log-probabilities, in forwards of at most ``batch_size`` requests of similar lengths
        (``reach_lens.generate.loglik``): requests that share a context share its forward when the model runs the
        engine's cached attention and every hook is positionwise, otherwise each runs as one padded sequence.
        Only the positions that predict continuation tokens go through the unembedding."""
        if batch_size < 1:
            raise ValueError(f"batch_size {batch_size} out of range: expected >= 1")
        model = self.model
        source = PositionSource()
        hooks = hooks_for(interventions, model, source)
        attached_saes(model)  # refuses SAE settings a block-by-block forward would not reproduce
        for i, r in enumerate(requests):
            bad = [t for t in r.context + r.continuation if not 0 <= t < model.cfg.d_vocab]
            if bad:
                raise ValueError(f"loglik request {i}: token id {bad[0]} out of range for vocabulary size "
                                 f"{model.cfg.d_vocab}")
        fast = fast_attention_supported(model)
        shared = self.share_prefixes and fast and all(is_positionwise(fn) for _, fn in hooks) \
            and not hooks_registered(model)
        sums = torch.zeros(len(requests), dtype=torch.float64, device=CPU)  # not the default device
        with torch.no_grad(), model.hooks(fwd_hooks=hooks), fast_attention(model, fast):
            chunks = (shared_context_rows if shared else padded_rows)(model, source, requests, batch_size)
            for owners, resid, targets in chunks:
                picked = resid.to(model.unembed.W_U.device)
                if model.cfg.normalization_type is not None:
                    picked = model.ln_final(picked[None])[0]
                logits = apply_softcap(model.unembed(picked[None])[0], model.cfg.output_logits_soft_cap).float()
                check_finite(logits, owners, lambda bad: f"loglik request {bad} (context of "
                                                         f"{len(requests[bad].context)} tokens)")
                logp = torch.log_softmax(logits, dim=-1)
                token_logp = logp[torch.arange(len(targets), device=logp.device),
                                  torch.tensor(targets, device=logp.device)]
                sums.index_add_(0, torch.tensor(owners, device=CPU), token_logp.double().cpu())
        return sums.tolist()


def attached_saes(model: HookedTransformer) -> list[tuple[str, torch.nn.Module, torch.nn.Module]]:
    """(hook point name, wrapper module, SAE) of every SAE SAELens's ``HookedSAETransformer`` spliced in at a hook
    point (duck-typed: sae_lens is optional). Refuses, with ``EngineCapabilityError``, SAE settings that the engine's
    block-by-block, cached forward would not reproduce: a mask of special tokens (``exclude_special_tokens``, set
    by ``HookedSAETransformer.forward``, which the engine does not call) and an SAE that attends over earlier
    positions (SAELens's temporal SAE)."""
    found = []
    for name, module in model.named_modules():
        sae = getattr(module, "sae", None)
        if not (isinstance(sae, torch.nn.Module) and hasattr(module, "use_error_term")):
            continue
        if getattr(module, "exclude_special_tokens", False) is not False:
            raise EngineCapabilityError(
                f"the SAE at {name!r} was attached with exclude_special_tokens: HookedSAETransformer.forward builds "
                "that mask and the engine runs the blocks itself; attach it with exclude_special_tokens=False")
        if getattr(sae.cfg, "architecture", lambda: None)() == "temporal":
            raise EngineCapabilityError(
                f"the SAE at {name!r} ({type(sae).__name__}) attends over earlier positions: cached decoding shows it "
                "one position per step, so the engine cannot run it")
        found.append((name, module, sae))
    return found


def hooks_registered(model: HookedTransformer) -> bool:
    """Whether any forward hook is registered on the model's modules right now (ours or anyone's)."""
    return any(module._forward_hooks or module._forward_pre_hooks for module in model.modules())


def first_hooked_layer(model: HookedTransformer) -> int:
    """The first block any forward hook on the model can touch: -1 for the embedding, ``n_layers`` when only
    ``ln_final``/unembed (or nothing) is hooked. Reads the hooks registered right now, ours and anyone's."""
    n_layers = model.cfg.n_layers
    first = n_layers
    for name, module in model.named_modules():
        if not (module._forward_hooks or module._forward_pre_hooks):
            continue
        match = _BLOCK.match(name)
        if match:
            first = min(first, int(match.group(1)))
        elif not name.startswith(("ln_final", "unembed")):
            return -1
    return first


_ENGINES: weakref.WeakKeyDictionary[HookedTransformer, TransformerLensEngine] = weakref.WeakKeyDictionary()


def engine_for(model: HookedTransformer | Engine) -> Engine:
    """The engine of ``model``: itself if it is an ``Engine``, else one ``TransformerLensEngine`` per model
    object, kept while the model lives and dropped with it (so its clean prompt prefixes are reused across calls,
    and a model no one else holds is freed with its engine)."""
    if isinstance(model, Engine):
        return model
    if not isinstance(model, HookedTransformer):
        raise TypeError(f"expected a HookedTransformer or an Engine, got {type(model).__name__}")
    engine = _ENGINES.get(model)
    if engine is None:
        engine = _ENGINES[model] = TransformerLensEngine(model, weak=True)
    return engine
