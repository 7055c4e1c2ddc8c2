"""Batched token-level generation over a ``HookedTransformer`` with a KV cache.

    gens = generate(model, [ids_a, ids_b], n_per_prompt=16, temperature=0.8, seeds=[1, 2],
                    max_new_tokens=32, hooks=silence_mlp_hooks)      # gens[i][k]: Generation

How it runs (and why it is faster than ``HookedTransformer.generate``):

- Each prompt is prefilled once, alone (batch 1, no padding), and its KV cache is copied into the
  ``n_per_prompt`` decode rows that sample from it.
- Decode rows of different prompts share one batch. The cache is stored right-aligned: every row's
  tokens end at the same column and shorter rows are masked on the left; rotary positions come from
  the mask (each row counts its own tokens from 0), as in TransformerLens's padded generation.
- A finished row frees its slot, and the next waiting row is written into it (continuous batching),
  so the batch stays full while rows have different lengths. Rows therefore move between slots and
  batches: hooks must be row-independent, or come from ``row_hooks`` (below).
- Keys are stored already rotated in preallocated buffers, and attention is computed per KV-head
  group, so a decode step does not copy or re-rotate the whole cache (TransformerLens 3.9's attention
  does both on every step). This attention replaces each block's ``attn.forward`` for the duration of
  a call only, fires the same hook points with the same shapes as TransformerLens's cached attention,
  and is used for the configurations it supports (rotary, causal, global attention, no attention
  result/split inputs); any other model runs TransformerLens's own attention on the same cache.
- Only the last position of the prefill goes through ``ln_final`` and the unembedding, so hooks on
  ``ln_final`` see ``[batch, 1, d_model]``, as on every decode step.

Determinism: row ``k`` of prompt ``i`` samples with its own ``torch.Generator`` seeded from
``(seeds[i], k)``, so its tokens do not depend on which other prompts share the batch, their order,
or ``batch_size`` (up to float rounding, which varies with the batch's shape and can flip a near-tie).

Prefix reuse: an intervention at layer ``l`` leaves layers ``< l`` of the prompt unchanged.
``make_prefix`` runs the clean prompts once up to the largest layer needed and keeps their KV caches and
``blocks.{l}.hook_resid_pre``; ``generate(..., start_layer=l, prefix=state)`` then prefills only layers
``>= l`` (decode steps run every layer as usual). Hooks must then sit at layers ``>= l``.
"""

from __future__ import annotations

import functools
import hashlib
import re
import types
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer, TransformerLensKeyValueCache, TransformerLensKeyValueCacheEntry
from transformer_lens.components.abstract_attention import AbstractAttention
from transformer_lens.hook_points import HookPoint
from transformer_lens.utilities import apply_softcap

from reach_lens.hooks import HookFn

Hooks = Sequence[tuple[str, HookFn]]  # a name may also be a filter on hook names, as in TransformerLens
RowHooks = Callable[[list[int]], Hooks]
FINISH_REASONS = ("eos", "stop", "length")
_PRE_BLOCK_HOOKS = ("hook_embed", "hook_pos_embed", "hook_tokens")


@dataclass(frozen=True)
class Generation:
    """One generated continuation.

    ``tokens`` are the new tokens, including the one that ended the row (the EOS token, or the token that
    completed a stop string). ``token_logprobs[t]`` is the log-probability of ``tokens[t]`` under the
    model's *untempered* next-token distribution (temperature 1), whatever temperature sampled it, and
    ``entropy`` is the mean over steps of that distribution's entropy (nats). ``text`` is the decoded
    continuation cut before the first stop string (None when no decoder was available).
    """

    tokens: list[int]
    token_logprobs: list[float]
    entropy: float
    finish_reason: str
    text: str | None

    @property
    def mean_logprob(self) -> float:
        return sum(self.token_logprobs) / len(self.token_logprobs)


@dataclass(frozen=True)
class PrefixState:
    """Clean prompt prefixes for ``generate(start_layer=l)``, made by ``make_prefix``.

    Per prompt: keys/values of layers ``< max(layers)``, each ``[kv_head, pos, d_head]`` (rotated when
    ``rotated``), and ``resid_pre[l]`` = ``blocks.{l}.hook_resid_pre`` as ``[pos, d_model]`` for each l.
    """

    prompts: tuple[tuple[int, ...], ...]
    layers: tuple[int, ...]
    keys: list[list[Tensor]]
    values: list[list[Tensor]]
    resid_pre: list[dict[int, Tensor]]
    rotated: bool


# ---------------------------------------------------------------------------------------------------
# KV cache: preallocated, right-aligned rows


class _Entry(TransformerLensKeyValueCacheEntry):
    """One layer's keys and values in buffers ``[batch, kv_head, capacity, d_head]``; the first
    ``length`` columns are filled. TransformerLens sees ``[batch, pos, kv_head, d_head]`` views."""

    def __init__(self, keys: Tensor, values: Tensor, length: int):  # noqa: D107 (no dataclass init)
        self.keys, self.values, self.length, self.frozen = keys, values, length, False

    @property
    def past_keys(self) -> Float[Tensor, "batch pos kv_head d_head"]:  # type: ignore[override]
        return self.keys[:, :, : self.length].transpose(1, 2)

    @property
    def past_values(self) -> Float[Tensor, "batch pos kv_head d_head"]:  # type: ignore[override]
        return self.values[:, :, : self.length].transpose(1, 2)

    def append(self, new_keys: Tensor, new_values: Tensor) -> tuple[Tensor, Tensor]:
        """Write ``[batch, new, kv_head, d_head]`` after the filled columns; return all filled columns."""
        end = self.length + new_keys.shape[1]
        if end > self.keys.shape[2]:
            raise RuntimeError(f"KV buffer overflow: {end} columns > capacity {self.keys.shape[2]}")
        self.keys[:, :, self.length : end] = new_keys.transpose(1, 2)
        self.values[:, :, self.length : end] = new_values.transpose(1, 2)
        self.length = end
        return self.past_keys, self.past_values


class _Cache(TransformerLensKeyValueCache):
    """A ``TransformerLensKeyValueCache`` of ``_Entry`` buffers. ``previous_attention_mask`` is
    ``[batch, width]``; row ``r`` holds its tokens in the last ``lengths[r]`` columns."""

    @classmethod
    def allocate(cls, model: HookedTransformer, batch: int, capacity: int) -> "_Cache":
        cfg = model.cfg
        kv_heads = cfg.n_key_value_heads or cfg.n_heads
        shape = (batch, kv_heads, capacity, cfg.d_head)
        entries = [_Entry(torch.zeros(shape, dtype=cfg.dtype, device=cfg.device),
                          torch.zeros(shape, dtype=cfg.dtype, device=cfg.device), 0)
                   for _ in range(cfg.n_layers)]
        mask = torch.zeros((batch, 0), dtype=torch.long, device=cfg.device)
        return cls(entries=entries, previous_attention_mask=mask)

    @property
    def width(self) -> int:
        return self.entries[0].length

    @property
    def capacity(self) -> int:
        return self.entries[0].keys.shape[2]

    def reset_mask(self, lengths: Int[Tensor, " batch"]) -> None:
        device = self.previous_attention_mask.device
        columns = torch.arange(self.width, device=device)
        self.previous_attention_mask = (columns[None, :] >= self.width - lengths.to(device)[:, None]).long()

    def gather(self, slots: list[int], lengths: Int[Tensor, " batch"], width: int, capacity: int) -> "_Cache":
        """A new cache of rows ``slots``, right-aligned to ``width`` columns (each slot's
        ``lengths`` tokens must fit), with room for ``capacity`` columns."""
        out = _Cache.allocate_like(self, len(slots), capacity)
        keep = min(width, self.width)
        index = torch.tensor(slots, dtype=torch.long, device=self.previous_attention_mask.device)
        for src, dst in zip(self.entries, out.entries):
            dst.keys[:, :, width - keep : width] = src.keys[index, :, src.length - keep : src.length]
            dst.values[:, :, width - keep : width] = src.values[index, :, src.length - keep : src.length]
            dst.length = width
        out.reset_mask(lengths)
        return out

    @staticmethod
    def allocate_like(cache: "_Cache", batch: int, capacity: int) -> "_Cache":
        k = cache.entries[0].keys
        shape = (batch, k.shape[1], capacity, k.shape[3])
        entries = [_Entry(torch.zeros(shape, dtype=k.dtype, device=k.device),
                          torch.zeros(shape, dtype=k.dtype, device=k.device), 0) for _ in cache.entries]
        mask = torch.zeros((batch, 0), dtype=torch.long, device=k.device)
        return _Cache(entries=entries, previous_attention_mask=mask)

    def write_row(self, slot: int, source: "_Cache", n: int) -> None:
        """Copy the ``n`` filled columns of batch-1 ``source`` into the last ``n`` columns of ``slot``."""
        w = self.width
        for src, dst in zip(source.entries, self.entries):
            dst.keys[slot, :, w - n : w] = src.keys[0, :, :n]
            dst.values[slot, :, w - n : w] = src.values[0, :, :n]
        self.previous_attention_mask[slot] = (torch.arange(w, device=self.previous_attention_mask.device) >= w - n)


# ---------------------------------------------------------------------------------------------------
# Attention over the cache: rotated keys stored once, grouped-query products without copies


def _fast_attention_supported(model: HookedTransformer) -> bool:
    cfg = model.cfg
    return (
        cfg.positional_embedding_type == "rotary"
        and cfg.attention_dir == "causal"
        and not (cfg.use_attn_result or cfg.use_split_qkv_input or cfg.use_attn_in)
        and not (cfg.use_attention_sinks or cfg.use_logn_attn or cfg.use_dynamic_ntk_rope or cfg.load_in_4bit)
        and cfg.clip_qkv is None
        and cfg.original_architecture not in ("OlmoeForCausalLM", "Olmo2ForCausalLM", "Olmo3ForCausalLM")
        and all(isinstance(b.attn, AbstractAttention) and b.attn.attn_type == "global"
                and b.attn._attention_dir_override is None for b in model.blocks)
    )


def _cached_attention(
    self: AbstractAttention,
    query_input: Float[Tensor, "batch pos d_model"],
    key_input: Float[Tensor, "batch pos d_model"],
    value_input: Float[Tensor, "batch pos d_model"],
    past_kv_cache_entry: TransformerLensKeyValueCacheEntry | None = None,
    additive_attention_mask: Tensor | None = None,
    attention_mask: Int[Tensor, "batch kv_pos"] | None = None,
    position_bias: Tensor | None = None,
) -> Float[Tensor, "batch pos d_model"]:
    """``AbstractAttention.forward`` for an ``_Entry`` cache holding rotated keys; same math and hooks."""
    if not isinstance(past_kv_cache_entry, _Entry) or attention_mask is None or additive_attention_mask is not None:
        return type(self).forward(self, query_input, key_input, value_input, past_kv_cache_entry,
                                  additive_attention_mask, attention_mask, position_bias)
    q, k, v = self.calculate_qkv_matrices(query_input, key_input, value_input)
    batch, n_new, n_heads, d_head = q.shape
    positions = attention_mask.cumsum(-1)[:, -n_new:] - 1  # [batch, n_new]: each row counts its own tokens
    needed = int(positions.max()) + 1
    if needed > self.rotary_cos.shape[0]:
        self._extend_rotary_embeddings(min(self.cfg.n_ctx, max(needed, 2 * self.rotary_cos.shape[0])))
    q = self.hook_rot_q(self._rotate(q, positions))
    keys, values = past_kv_cache_entry.append(self._rotate(k, positions), v)
    keys = self.hook_rot_k(keys)  # [batch, kv_pos, kv_head, d_head], as TransformerLens's cached attention
    kv_heads, kv_pos = keys.shape[2], keys.shape[1]
    group = n_heads // kv_heads
    # query head h reads kv head h // group (TransformerLens's repeat_interleave)
    q_grouped = q.permute(0, 2, 1, 3).reshape(batch, kv_heads, group * n_new, d_head)
    scores = (q_grouped @ keys.permute(0, 2, 3, 1)) / self.attn_scale
    scores = apply_softcap(scores.view(batch, n_heads, n_new, kv_pos), self.cfg.attn_scores_soft_cap)
    query_columns = torch.arange(kv_pos - n_new, kv_pos, device=scores.device)
    visible = torch.arange(kv_pos, device=scores.device)[None, :] <= query_columns[:, None]
    visible = visible[None, None] & attention_mask.bool()[:, None, None, :]
    scores = self.hook_attn_scores(torch.where(visible, scores, self.IGNORE))
    pattern = F.softmax(scores, dim=-1)
    pattern = self.hook_pattern(torch.where(torch.isnan(pattern), torch.zeros_like(pattern), pattern))
    z = pattern.reshape(batch, kv_heads, group * n_new, kv_pos).to(values.dtype) @ values.permute(0, 2, 1, 3)
    z = self.hook_z(z.view(batch, n_heads, n_new, d_head).transpose(1, 2))  # [batch, pos, head, d_head]
    return F.linear(z.reshape(batch, n_new, n_heads * d_head), _output_weight(self.W_O), self.b_O)


def _output_weight(W_O: Float[Tensor, "head d_head d_model"]) -> Float[Tensor, "d_model head_x_d_head"]:
    """``W_O`` as ``[d_model, head * d_head]``, a view (no copy) for ``[head, d_head, d_model]`` storage and for
    TransformerLens's ``[d_model, head, d_head]`` (rearrange-friendly) storage alike."""
    by_model = W_O.permute(2, 0, 1)
    return by_model.flatten(1) if by_model.is_contiguous() else W_O.flatten(0, 1).T


def _rotate(self: AbstractAttention, x: Tensor, positions: Int[Tensor, "batch pos"]) -> Tensor:
    """Rotary embedding of ``x`` ``[batch, pos, head, d_head]`` at per-row ``positions``."""
    rotary_dim = self.cfg.rotary_dim
    x_rot = x[..., :rotary_dim]
    cos = self.rotary_cos[positions][:, :, None, :]
    sin = self.rotary_sin[positions][:, :, None, :]
    rotated = x_rot * cos + self.rotate_every_two(x_rot) * sin
    return rotated if rotary_dim == x.shape[-1] else torch.cat([rotated, x[..., rotary_dim:]], dim=-1)


@contextmanager
def _cached_attention_installed(model: HookedTransformer, enabled: bool) -> Iterator[None]:
    """Route each block's attention through ``_cached_attention`` while inside (instance attributes only)."""
    if not enabled:
        yield
        return
    attns = [block.attn for block in model.blocks]
    saved = [attn.__dict__.get("forward") for attn in attns]
    try:
        for attn in attns:
            attn.forward = types.MethodType(_cached_attention, attn)
            attn._rotate = types.MethodType(_rotate, attn)
        yield
    finally:
        for attn, old in zip(attns, saved):
            del attn.forward, attn._rotate
            if old is not None:
                attn.forward = old


# ---------------------------------------------------------------------------------------------------
# Forward passes


def _last_logits(model: HookedTransformer, resid: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch d_vocab"]:
    x = resid[:, -1:]
    if model.cfg.normalization_type is not None:
        x = model.ln_final(x)
    return apply_softcap(model.unembed(x), model.cfg.output_logits_soft_cap)[:, 0]


def _prefill(model: HookedTransformer, prompt: list[int], start_layer: int | None = None,
             prefix: PrefixState | None = None, index: int = 0) -> tuple[_Cache, Tensor]:
    """Batch-1 cache of ``prompt`` and its next-token logits ``[1, d_vocab]``; with ``start_layer``, layers
    below it come from prompt ``index`` of ``prefix``."""
    n = len(prompt)
    cache = _Cache.allocate(model, 1, n)
    ones = torch.ones((1, n), dtype=torch.long, device=model.cfg.device)
    if start_layer is None:
        tokens = torch.tensor([prompt], dtype=torch.long, device=model.cfg.device)
        resid = model(tokens, attention_mask=ones, past_kv_cache=cache, stop_at_layer=model.cfg.n_layers)
    else:
        assert prefix is not None
        for layer in range(start_layer):
            entry = cache.entries[layer]
            entry.keys[0, :, :n] = prefix.keys[index][layer]
            entry.values[0, :, :n] = prefix.values[index][layer]
            entry.length = n
        cache.previous_attention_mask = ones
        resid_pre = prefix.resid_pre[index][start_layer][None].to(model.cfg.dtype)
        resid = model(resid_pre, start_at_layer=start_layer, stop_at_layer=model.cfg.n_layers,
                      attention_mask=ones, past_kv_cache=cache)
    return cache, _last_logits(model, resid)


def make_prefix(model: HookedTransformer, prompts: Sequence[Sequence[int]], layers: Sequence[int]) -> PrefixState:
    """Run each clean prompt (no hooks) up to layer ``max(layers)`` and keep what ``generate(start_layer=l)``
    needs for every ``l`` in ``layers``: the KV caches of layers ``< max(layers)`` and each
    ``blocks.{l}.hook_resid_pre``. Memory: about ``pos * (n_layers * 2 * kv_heads * d_head + len(layers) *
    d_model)`` floats per prompt."""
    n_layers = model.cfg.n_layers
    layers = tuple(sorted(set(layers)))
    if not layers:
        raise ValueError("make_prefix needs at least one layer")
    for layer in layers:
        if not 0 <= layer < n_layers:
            raise ValueError(f"layer {layer} out of range for a {n_layers}-layer model (0..{n_layers - 1})")
    prompts = _check_prompts(model, prompts)
    fast = _fast_attention_supported(model)
    top = layers[-1]
    keys, values, resid_pre = [], [], []
    for prompt in prompts:
        captured: dict[int, Tensor] = {}

        def capture(act: Tensor, hook: HookPoint, layer: int) -> Tensor:
            captured[layer] = act[0].detach().clone()
            return act

        capture_hooks = [(f"blocks.{layer}.hook_resid_pre", functools.partial(capture, layer=layer))
                         for layer in layers if layer < top]
        cache = _Cache.allocate(model, 1, len(prompt))
        tokens = torch.tensor([list(prompt)], dtype=torch.long, device=model.cfg.device)
        ones = torch.ones_like(tokens)
        with torch.no_grad(), model.hooks(fwd_hooks=capture_hooks), _cached_attention_installed(model, fast):
            resid = model(tokens, attention_mask=ones, past_kv_cache=cache, stop_at_layer=top)
        captured[top] = resid[0].detach().clone()
        keys.append([e.keys[0, :, : len(prompt)].clone() for e in cache.entries[:top]])
        values.append([e.values[0, :, : len(prompt)].clone() for e in cache.entries[:top]])
        resid_pre.append(captured)
    return PrefixState(tuple(tuple(p) for p in prompts), layers, keys, values, resid_pre, rotated=fast)


# ---------------------------------------------------------------------------------------------------
# Sampling


def row_seed(seed: int, sample: int) -> int:
    """The generator seed of sample ``sample`` of a prompt whose seed is ``seed`` (a stable 63-bit hash)."""
    digest = hashlib.sha256(f"{seed}/{sample}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _choose(logits: Float[Tensor, "rows d_vocab"], temperature: float,
            generators: list[torch.Generator | None]) -> tuple[Tensor, Tensor, Tensor]:
    """Chosen tokens, their untempered log-probabilities and the untempered entropies, each ``[rows]``."""
    logits = logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    entropy = -(logp.exp() * logp).sum(-1)
    if temperature == 0.0:
        tokens = logits.argmax(-1)
    else:
        cdf = torch.softmax(logits / temperature, dim=-1).double().cumsum(-1)
        u = torch.stack([torch.rand((), generator=g, dtype=torch.float64) for g in generators]).to(cdf.device)
        tokens = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0].clamp_(max=logits.shape[-1] - 1)
    return tokens, logp.gather(-1, tokens[:, None])[:, 0], entropy


@dataclass
class _Row:
    prompt: int
    sample: int
    generator: torch.Generator | None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    text: str | None = None
    finish_reason: str | None = None


class _StopCheck:
    """Ends rows at a stop token, a stop string in the decoded continuation, or the length budget."""

    def __init__(self, stop_token_ids: Sequence[int], stop_strings: Sequence[str],
                 decode: Callable[[list[int]], str] | None, max_new_tokens: int):
        self.stop_ids = set(stop_token_ids)
        self.stop_strings = tuple(s for s in stop_strings if s)
        self.decode = decode
        self.max_new_tokens = max_new_tokens
        # a stop string of c characters spans at most 4c byte-level tokens; the margin covers
        # decoders that drop a leading space of their first token
        self.window = 4 * max((len(s) for s in self.stop_strings), default=0) + 8

    def update(self, row: _Row) -> None:
        if row.tokens[-1] in self.stop_ids:
            row.finish_reason = "eos"
        elif self.stop_strings and self._stop_text(row) is not None:
            row.finish_reason = "stop"
            return
        elif len(row.tokens) >= self.max_new_tokens:
            row.finish_reason = "length"
        if row.finish_reason is not None and self.decode is not None:
            row.text = self.decode(row.tokens)

    def _stop_text(self, row: _Row) -> str | None:
        assert self.decode is not None
        tail = self.decode(row.tokens[-self.window :])
        if not any(s in tail for s in self.stop_strings):
            return None
        text = self.decode(row.tokens)
        cuts = [text.find(s) for s in self.stop_strings if s in text]
        if not cuts:
            return None
        row.text = text[: min(cuts)]
        return row.text


def _check_prompts(model: HookedTransformer, prompts: Sequence[Sequence[int]]) -> list[list[int]]:
    vocab = model.cfg.d_vocab
    out = []
    for i, prompt in enumerate(prompts):
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise ValueError(f"prompt {i} is empty: every prompt needs at least one token")
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt {i} has token id {bad[0]} out of range for vocabulary size {vocab} (0..{vocab - 1})")
        out.append(prompt)
    return out


def _hook_layers(model: HookedTransformer, hooks: Hooks) -> list[tuple[str, int]]:
    """(hook point name, layer) of every hook point the hooks reach; -1 for embedding hooks."""
    found = []
    for name, _ in hooks:
        names = [name] if isinstance(name, str) else [n for n in model.hook_dict if name(n)]
        for n in names:
            match = re.match(r"blocks\.(\d+)\.", n)
            if match:
                found.append((n, int(match.group(1))))
            elif n in _PRE_BLOCK_HOOKS:
                found.append((n, -1))
    return found


def _check_start_layer(model: HookedTransformer, hooks: Hooks, start_layer: int) -> None:
    for name, layer in _hook_layers(model, hooks):
        if layer < start_layer:
            raise ValueError(
                f"hook {name!r} is before start_layer {start_layer}: it would not run on the reused prompt "
                f"prefix; use start_layer <= {max(layer, 0)} or no prefix"
            )


def generate(
    model: HookedTransformer,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    n_per_prompt: int = 1,
    temperature: float = 0.0,
    seeds: Sequence[int] | None = None,
    stop_token_ids: Sequence[int] | None = None,
    stop_strings: Sequence[str] = (),
    decode_fn: Callable[[list[int]], str] | None = None,
    hooks: Hooks = (),
    row_hooks: RowHooks | None = None,
    batch_size: int = 16,
    start_layer: int | None = None,
    prefix: PrefixState | None = None,
) -> list[list[Generation]]:
    """Generate ``n_per_prompt`` continuations of each prompt (token ids); ``result[i][k]`` is sample k of
    prompt i.

    - ``temperature`` 0 is greedy (argmax); otherwise softmax(logits / temperature) sampling, and
      ``seeds`` (one per prompt) are required: sample k of prompt i uses ``row_seed(seeds[i], k)``.
    - A row ends at a token of ``stop_token_ids`` (default: the tokenizer's EOS; pass ``()`` for none),
      at the first of ``stop_strings`` in its decoded continuation, or after ``max_new_tokens``.
    - ``decode_fn`` (token ids -> text; default: the tokenizer's decode without special tokens) decodes
      continuations for stop strings and ``Generation.text``.
    - ``hooks`` are active for the whole call; they see the prefill at batch 1 and decode steps as
      ``[batch, 1, ...]`` over whichever rows are running, so they must treat rows alike.
      ``row_hooks(rows)`` returns extra hooks for one forward pass whose batch holds global rows
      ``rows`` (``i * n_per_prompt + k``; -1 marks an idle slot whose output is discarded); with
      ``row_hooks`` every row is prefilled on its own.
    - ``batch_size`` is the number of decode rows run together.
    - ``start_layer``/``prefix`` reuse a clean prefix from ``make_prefix`` for the same prompts (see the
      module docstring).
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens {max_new_tokens} out of range: expected >= 1")
    if n_per_prompt < 1:
        raise ValueError(f"n_per_prompt {n_per_prompt} out of range: expected >= 1")
    if batch_size < 1:
        raise ValueError(f"batch_size {batch_size} out of range: expected >= 1")
    if temperature < 0:
        raise ValueError(f"temperature {temperature} out of range: expected >= 0")
    prompts = _check_prompts(model, prompts)
    hooks = list(hooks)
    if temperature > 0:
        if seeds is None:
            raise ValueError(f"temperature {temperature} samples: pass seeds (one per prompt)")
        if len(seeds) != len(prompts):
            raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts: expected one seed per prompt")
    longest = max((len(p) for p in prompts), default=0)
    if longest + max_new_tokens > model.cfg.n_ctx:
        raise ValueError(f"prompt of {longest} tokens + max_new_tokens {max_new_tokens} exceeds the model's "
                         f"context n_ctx={model.cfg.n_ctx}")
    tokenizer = model.tokenizer
    if stop_token_ids is None:
        eos = getattr(tokenizer, "eos_token_id", None)
        stop_token_ids = () if eos is None else (eos,)
    if decode_fn is None and tokenizer is not None:
        decode_fn = _tokenizer_decode(tokenizer)
    if stop_strings and decode_fn is None:
        raise ValueError("stop_strings need a decode_fn (the model has no tokenizer)")
    if (start_layer is None) != (prefix is None):
        raise ValueError("start_layer and prefix go together: pass both (prefix from make_prefix) or neither")
    fast = _fast_attention_supported(model)
    if prefix is not None:
        assert start_layer is not None
        if start_layer not in prefix.layers:
            raise ValueError(f"start_layer {start_layer} is not in the prefix's layers {list(prefix.layers)}")
        if prefix.prompts != tuple(tuple(p) for p in prompts):
            raise ValueError("prefix was made for other prompts: make_prefix with the same prompts")
        if prefix.rotated != fast:
            raise ValueError("prefix was made by a model with another attention implementation")
        _check_start_layer(model, hooks, start_layer)

    stop = _StopCheck(stop_token_ids, stop_strings, decode_fn, max_new_tokens)
    rows = [
        _Row(i, k, None if temperature == 0 else torch.Generator().manual_seed(row_seed(int(seeds[i]), k)))
        for i in range(len(prompts)) for k in range(n_per_prompt)
    ]
    decoder = _Decoder(model, prompts, rows, n_per_prompt, temperature, stop, row_hooks, batch_size,
                       max_new_tokens, start_layer, prefix)
    with torch.no_grad(), model.hooks(fwd_hooks=hooks), _cached_attention_installed(model, fast):
        decoder.run()
    out: list[list[Generation]] = [[] for _ in prompts]
    for row in rows:
        assert row.finish_reason is not None
        entropy = sum(row.entropies) / len(row.entropies)
        out[row.prompt].append(Generation(row.tokens, row.logprobs, entropy, row.finish_reason, row.text))
    return out


def _tokenizer_decode(tokenizer) -> Callable[[list[int]], str]:
    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)
    return decode


class _Decoder:
    """The continuous-batching loop of ``generate``: slots of a right-aligned cache, refilled as rows end."""

    def __init__(self, model, prompts, rows, n_per_prompt, temperature, stop, row_hooks, batch_size,
                 max_new_tokens, start_layer, prefix):
        self.model, self.prompts, self.rows = model, prompts, rows
        self.n_per_prompt, self.temperature, self.stop = n_per_prompt, temperature, stop
        self.row_hooks, self.batch_size, self.max_new_tokens = row_hooks, batch_size, max_new_tokens
        self.start_layer, self.prefix = start_layer, prefix
        self.waiting = list(range(len(rows)))[::-1]  # global row ids, popped from the end
        self.prefilled: dict[int, tuple[_Cache, Tensor]] = {}  # prefill unit -> (batch-1 cache, logits)
        self.remaining: dict[int, int] = {}  # prefill unit -> rows still to start
        self.cache: _Cache | None = None
        self.first: list[tuple[int, _Cache, int]] = []  # rows started before the first batch exists
        self.slots: list[int] = []  # global row id per slot, -1 when idle
        self.lengths = torch.zeros(0, dtype=torch.long)
        self.next_tokens = torch.zeros(0, dtype=torch.long)

    # ---- starting rows ------------------------------------------------------------------------

    def _unit(self, row_id: int) -> int:
        return row_id if self.row_hooks is not None else self.rows[row_id].prompt

    def _row_hook_context(self, row_ids: list[int]):
        if self.row_hooks is None:
            return nullcontext()
        extra = list(self.row_hooks(row_ids))
        if self.start_layer is not None:
            _check_start_layer(self.model, extra, self.start_layer)
        return self.model.hooks(fwd_hooks=extra)

    def _start(self, row_id: int) -> tuple[_Cache, int]:
        """Prefill (once per unit) and sample the row's first token; returns the unit's cache and length."""
        unit = self._unit(row_id)
        row = self.rows[row_id]
        prompt = self.prompts[row.prompt]
        if unit not in self.prefilled:
            with self._row_hook_context([row_id]):
                self.prefilled[unit] = _prefill(self.model, prompt, self.start_layer, self.prefix, row.prompt)
            self.remaining[unit] = 1 if self.row_hooks is not None else self.n_per_prompt
        cache, logits = self.prefilled[unit]
        self._record(row_id, logits)
        self.remaining[unit] -= 1
        if self.remaining[unit] == 0:
            del self.prefilled[unit], self.remaining[unit]
        return cache, len(prompt)

    def _record(self, row_id: int, logits: Float[Tensor, "1 d_vocab"]) -> None:
        row = self.rows[row_id]
        token, logprob, entropy = _choose(logits, self.temperature, [row.generator])
        row.tokens.append(int(token[0]))
        row.logprobs.append(float(logprob[0]))
        row.entropies.append(float(entropy[0]))
        self.stop.update(row)

    def _fill(self) -> None:
        """Start waiting rows in idle slots (or in a first batch); rows that end at once never take a slot."""
        while self.waiting:
            idle = [s for s, r in enumerate(self.slots) if r < 0]
            if self.cache is None:
                capacity_left = self.batch_size - len(self.slots)
            else:
                capacity_left = len(idle)
            if capacity_left == 0:
                return
            row_id = self.waiting.pop()
            source, length = self._start(row_id)
            if self.rows[row_id].finish_reason is not None:
                continue
            if self.cache is None:
                self.first.append((row_id, source, length))
                self.slots.append(row_id)
                continue
            if length > self.cache.width:
                self._regather(keep_idle=True, width=length)
                idle = [s for s, r in enumerate(self.slots) if r < 0]
            slot = idle[0]
            self.cache.write_row(slot, source, length)
            self.slots[slot] = row_id
            self.lengths[slot] = length
            self.next_tokens[slot] = self.rows[row_id].tokens[-1]

    def _first_batch(self) -> None:
        self._fill()
        if not self.first:
            return
        width = max(length for _, _, length in self.first)
        self.cache = _Cache.allocate(self.model, len(self.first), width + self.max_new_tokens)
        for entry in self.cache.entries:
            entry.length = width
        self.lengths = torch.tensor([length for _, _, length in self.first], dtype=torch.long)
        self.cache.reset_mask(self.lengths)
        self.next_tokens = torch.tensor([self.rows[r].tokens[-1] for r in self.slots], dtype=torch.long)
        for slot, (_, source, length) in enumerate(self.first):
            self.cache.write_row(slot, source, length)
        self.first = []

    def _regather(self, keep_idle: bool, width: int | None = None) -> None:
        """Rebuild the cache: drop idle slots unless ``keep_idle``, drop all-padding columns, make room."""
        assert self.cache is not None
        slots = [s for s, r in enumerate(self.slots) if keep_idle or r >= 0]
        lengths = self.lengths[slots].clone()
        lengths[torch.tensor([self.slots[s] < 0 for s in slots], dtype=torch.bool)] = 0
        width = int(lengths.max()) if width is None else width
        self.cache = self.cache.gather(slots, lengths, width, width + self.max_new_tokens + 1)
        self.slots = [self.slots[s] for s in slots]
        self.lengths = lengths
        self.next_tokens = self.next_tokens[slots]

    # ---- the loop -------------------------------------------------------------------------------

    def run(self) -> None:
        self._first_batch()
        while self.cache is not None and any(r >= 0 for r in self.slots):
            if self.cache.width + 1 > self.cache.capacity:
                self._regather(keep_idle=bool(self.waiting))
            self._step()
            n_idle = sum(r < 0 for r in self.slots)
            if n_idle and self.waiting:
                self._fill()
            elif n_idle and 2 * n_idle >= len(self.slots) and any(r >= 0 for r in self.slots):
                self._regather(keep_idle=False)

    def _step(self) -> None:
        assert self.cache is not None
        device = self.model.cfg.device
        tokens = self.next_tokens[:, None].to(device)
        with self._row_hook_context(list(self.slots)):
            resid = self.model(tokens, attention_mask=torch.ones_like(tokens), past_kv_cache=self.cache,
                               stop_at_layer=self.model.cfg.n_layers)
            logits = _last_logits(self.model, resid)
        live = [s for s, r in enumerate(self.slots) if r >= 0]
        self.lengths[live] += 1
        chosen, logprobs, entropies = _choose(logits[live], self.temperature,
                                              [self.rows[self.slots[s]].generator for s in live])
        for j, slot in enumerate(live):
            row = self.rows[self.slots[slot]]
            row.tokens.append(int(chosen[j]))
            row.logprobs.append(float(logprobs[j]))
            row.entropies.append(float(entropies[j]))
            self.next_tokens[slot] = int(chosen[j])
            self.stop.update(row)
            if row.finish_reason is not None:
                self.slots[slot] = -1
                self.lengths[slot] = 0
