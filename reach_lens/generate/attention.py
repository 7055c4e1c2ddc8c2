"""KV caches in preallocated buffers, and an attention that reads them without copies.

- ``Entry``: one block's keys and values, ``[batch, kv_head, capacity, d_head]`` buffers of which the first
  ``length`` columns are filled; TransformerLens's attention sees ``[batch, pos, kv_head, d_head]`` views.
- ``DecodeCache``: one ``Entry`` per *schedule slot* (a route that repeats a layer has one slot per run of
  it, each with its own keys and values). Rows are right-aligned: every row's tokens end at the same column
  and a shorter row is masked on its left; ``previous_attention_mask`` is ``[batch, width]``.
- ``fast_attention``: while installed, each block's attention stores keys already rotated and computes
  grouped-query products per KV-head group, so a decode step neither copies nor re-rotates the cache
  (TransformerLens 3.9's attention does both on every step). It fires the same hook points with the same
  shapes, reads each row's rotary positions from the attention mask (each row counts its own tokens from
  0), and is used only for the configurations it supports (rotary, causal, global or sliding-window attention,
  no per-head inputs or results, no QK clipping or sinks); any other model runs TransformerLens's own attention
  on the same cache (keys then stay unrotated; ``TransformerLensEngine.attention`` says which). A sliding window counts
  columns, as TransformerLens's mask does: a row's tokens fill consecutive columns, so a column distance is a
  token distance.
"""

from __future__ import annotations

import types
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer, TransformerLensKeyValueCache, TransformerLensKeyValueCacheEntry
from transformer_lens.components.abstract_attention import AbstractAttention
from transformer_lens.utilities import apply_softcap


def rows_that_fit(model: HookedTransformer, slots: int, capacity: int, cap: int, share: float = 0.5) -> int:
    """How many decode rows of ``slots`` KV entries and ``capacity`` columns fit in ``share`` of the free memory of
    a CUDA model's first device (at most ``cap``, at least 1); ``cap`` on other devices."""
    device = model.embed.W_E.device
    if device.type != "cuda":
        return cap
    cfg = model.cfg
    element = torch.finfo(cfg.dtype).bits // 8
    per_row = 2 * slots * capacity * (cfg.n_key_value_heads or cfg.n_heads) * cfg.d_head * element
    per_row += 4 * (cfg.d_vocab + 4 * cfg.d_model)  # float32 logits and activations of one position
    free, _ = torch.cuda.mem_get_info(device)
    return max(1, min(cap, int(share * free / per_row)))


def block_device(model: HookedTransformer, layer: int) -> torch.device:
    """Where block ``layer``'s parameters live (models split over devices run each block where it is)."""
    return next(model.blocks[layer].parameters()).device


class Entry(TransformerLensKeyValueCacheEntry):
    """One block's keys and values in preallocated buffers (see the module docstring)."""

    def __init__(self, keys: Tensor, values: Tensor, length: int):
        self.keys, self.values, self.length, self.frozen = keys, values, length, False

    @classmethod
    def empty(cls, model: HookedTransformer, batch: int, capacity: int, device: torch.device | str) -> Entry:
        """Buffers with no columns filled. Their memory is not initialized: a column is read only after it is
        written (``append``, ``DecodeCache.write_row`` and ``gather`` write every column a row can see)."""
        cfg = model.cfg
        shape = (batch, cfg.n_key_value_heads or cfg.n_heads, capacity, cfg.d_head)
        return cls(torch.empty(shape, dtype=cfg.dtype, device=device), torch.empty(shape, dtype=cfg.dtype, device=device), 0)

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

    def rows(self, index: Tensor) -> Entry:
        """A copy of batch rows ``index`` (their filled columns, and room for one more): the entry of a decode step
        that runs this block on those rows alone (``take_step``)."""
        end = self.length + 1
        return Entry(self.keys[index, :, :end], self.values[index, :, :end], self.length)

    def take_step(self, sub: Entry, index: Tensor) -> None:
        """Write the column ``sub`` (``rows(index)``) appended into rows ``index`` and advance by one column.
        The other rows' new column stays unwritten: they do not run this block, so no output they keep depends on it."""
        column = self.length
        if sub.length != column + 1:
            raise RuntimeError(f"a decode step appends one column; {sub.length - column} were appended")
        self.keys[index, :, column] = sub.keys[:, :, column]
        self.values[index, :, column] = sub.values[:, :, column]
        self.length = column + 1

    def row(self, index: int) -> tuple[Tensor, Tensor]:
        """Keys and values of one batch row, ``[kv_head, length, d_head]`` each (views)."""
        return self.keys[index, :, : self.length], self.values[index, :, : self.length]


class DecodeCache(TransformerLensKeyValueCache):
    """One ``Entry`` per schedule slot over right-aligned rows (see the module docstring)."""

    @classmethod
    def allocate(cls, model: HookedTransformer, devices: Sequence[torch.device | str], batch: int,
                 capacity: int) -> DecodeCache:
        """Empty buffers, one entry per slot, slot ``j`` on ``devices[j]``."""
        entries = [Entry.empty(model, batch, capacity, d) for d in devices]
        mask = torch.zeros((batch, 0), dtype=torch.long, device=model.embed.W_E.device)
        return cls(entries=entries, previous_attention_mask=mask)

    @property
    def width(self) -> int:
        return self.entries[0].length

    @property
    def capacity(self) -> int:
        return self.entries[0].keys.shape[2]

    def set_width(self, width: int, lengths: Int[Tensor, " batch"]) -> None:
        """Mark ``width`` columns filled, row ``r``'s tokens being its last ``lengths[r]``."""
        for entry in self.entries:
            entry.length = width
        device = self.previous_attention_mask.device
        columns = torch.arange(width, device=device)
        self.previous_attention_mask = (columns[None, :] >= width - lengths.to(device)[:, None]).long()

    def write_row(self, slot: int, sources: Sequence[Sequence[tuple[Tensor, Tensor]] | None], n: int) -> None:
        """Copy keys/values of ``n`` positions per schedule slot, given as consecutive pieces ``[kv_head, m, d_head]``
        (a prompt's shared positions, then its own: each piece is copied once, nothing is concatenated first), into
        the last ``n`` columns of batch row ``slot``; None: the row does not run that slot, its columns are zeroed."""
        w = self.width
        for entry, pieces in zip(self.entries, sources):
            end = w if pieces is None else w - n
            entry.keys[slot, :, :end] = 0
            entry.values[slot, :, :end] = 0
            for keys, values in pieces or ():
                entry.keys[slot, :, end:end + keys.shape[1]] = keys
                entry.values[slot, :, end:end + keys.shape[1]] = values
                end += keys.shape[1]
            if end != w:
                raise RuntimeError(f"keys and values of {end - (w - n)} positions for a row of {n}")
        device = self.previous_attention_mask.device
        self.previous_attention_mask[slot] = (torch.arange(w, device=device) >= w - n).long()

    def gather(self, rows: list[int], lengths: Int[Tensor, " batch"], width: int, capacity: int) -> DecodeCache:
        """A new cache of batch rows ``rows``, right-aligned to ``width`` columns (each row's ``lengths`` tokens
        must fit), with room for ``capacity`` columns. This cache is emptied as it goes, each schedule slot's
        buffers let go once copied, so the rows' keys and values are never held twice over (16 rows of 1,300-token
        prompts through 30 blocks would otherwise hold 1 GB more while they are copied)."""
        out = DecodeCache(entries=[], previous_attention_mask=self.previous_attention_mask[:0])
        keep = min(width, self.width)
        for j, src in enumerate(self.entries):
            dst = Entry(src.keys.new_empty((len(rows), *src.keys.shape[1:2], capacity, src.keys.shape[3])),
                        src.values.new_empty((len(rows), *src.values.shape[1:2], capacity, src.values.shape[3])), 0)
            index = torch.tensor(rows, dtype=torch.long, device=src.keys.device)
            for new, old in ((dst.keys, src.keys), (dst.values, src.values)):
                new[:, :, : width - keep] = 0  # masked padding: read (as zeros) by attention, so defined
                new[:, :, width - keep : width] = old[index, :, src.length - keep : src.length]
            out.entries.append(dst)
            self.entries[j] = None  # with ``src`` rebound next, this slot's old buffers are freed
        out.set_width(width, lengths)
        return out


# ---------------------------------------------------------------------------------------------------
# Attention over the cache: rotated keys stored once, grouped-query products without copies


def fast_attention_supported(model: HookedTransformer) -> bool:
    """Whether ``fast_attention`` computes exactly what TransformerLens's attention computes for this model."""
    cfg = model.cfg
    return (
        cfg.positional_embedding_type == "rotary"
        and cfg.attention_dir == "causal"
        and not (cfg.use_attn_result or cfg.use_split_qkv_input or cfg.use_attn_in)
        and not (cfg.use_attention_sinks or cfg.use_logn_attn or cfg.use_dynamic_ntk_rope or cfg.load_in_4bit)
        and cfg.clip_qkv is None
        and cfg.original_architecture not in ("OlmoeForCausalLM", "Olmo2ForCausalLM", "Olmo3ForCausalLM")
        and all(isinstance(b.attn, AbstractAttention) and b.attn._attention_dir_override is None
                and (b.attn.attn_type == "global" or isinstance(cfg.window_size, int)) for b in model.blocks)
    )


def _fast_forward(
    self: AbstractAttention,
    query_input: Float[Tensor, "batch pos d_model"],
    key_input: Float[Tensor, "batch pos d_model"],
    value_input: Float[Tensor, "batch pos d_model"],
    past_kv_cache_entry: TransformerLensKeyValueCacheEntry | None = None,
    additive_attention_mask: Tensor | None = None,
    attention_mask: Int[Tensor, "batch kv_pos"] | None = None,
    position_bias: Tensor | None = None,
) -> Float[Tensor, "batch pos d_model"]:
    """``AbstractAttention.forward`` for an ``Entry`` holding rotated keys; same math, same hooks."""
    if not isinstance(past_kv_cache_entry, Entry) or attention_mask is None or additive_attention_mask is not None:
        return type(self).forward(self, query_input, key_input, value_input, past_kv_cache_entry,
                                  additive_attention_mask, attention_mask, position_bias)
    q, k, v = self.calculate_qkv_matrices(query_input, key_input, value_input)
    batch, n_new, n_heads, d_head = q.shape
    positions = attention_mask.cumsum(-1)[:, -n_new:] - 1  # [batch, n_new]: each row counts its own tokens
    needed = int(positions.max()) + 1
    if needed > self.rotary_cos.shape[0]:
        self._extend_rotary_embeddings(min(self.cfg.n_ctx, max(needed, 2 * self.rotary_cos.shape[0])))
    q = self.hook_rot_q(_rotate(self, q, positions))
    keys, values = past_kv_cache_entry.append(_rotate(self, k, positions), v)
    keys = self.hook_rot_k(keys)  # [batch, kv_pos, kv_head, d_head], as TransformerLens's cached attention
    kv_heads, kv_pos = keys.shape[2], keys.shape[1]
    group = n_heads // kv_heads
    # query head h reads kv head h // group (TransformerLens's repeat_interleave)
    q_grouped = q.permute(0, 2, 1, 3).reshape(batch, kv_heads, group * n_new, d_head)
    scores = (q_grouped @ keys.permute(0, 2, 3, 1)) / self.attn_scale
    scores = apply_softcap(scores.view(batch, n_heads, n_new, kv_pos), self.cfg.attn_scores_soft_cap)
    query_columns = torch.arange(kv_pos - n_new, kv_pos, device=scores.device)
    key_columns = torch.arange(kv_pos, device=scores.device)
    visible = key_columns[None, :] <= query_columns[:, None]
    if self.attn_type == "local":  # a sliding window (Gemma 2/3's local layers, Mistral)
        visible = visible & (key_columns[None, :] > query_columns[:, None] - self.cfg.window_size)
    visible = visible[None, None] & attention_mask.bool()[:, None, None, :]
    scores = self.hook_attn_scores(torch.where(visible, scores, self.IGNORE))
    pattern = F.softmax(scores, dim=-1)
    pattern = self.hook_pattern(torch.where(torch.isnan(pattern), torch.zeros_like(pattern), pattern))
    z = pattern.reshape(batch, kv_heads, group * n_new, kv_pos).to(values.dtype) @ values.permute(0, 2, 1, 3)
    z = self.hook_z(z.view(batch, n_heads, n_new, d_head).transpose(1, 2))  # [batch, pos, head, d_head]
    return F.linear(z.reshape(batch, n_new, n_heads * d_head), output_weight(self.W_O), self.b_O)


def output_weight(W_O: Float[Tensor, "head d_head d_model"]) -> Float[Tensor, "d_model head_x_d_head"]:
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
def fast_attention(model: HookedTransformer, enabled: bool) -> Iterator[None]:
    """Route each block's attention through the fast cached attention while inside (instance attributes only,
    restored on exit, also after an exception)."""
    if not enabled:
        yield
        return
    attns = [block.attn for block in model.blocks]
    saved = [attn.__dict__.get("forward") for attn in attns]
    try:
        for attn in attns:
            attn.forward = types.MethodType(_fast_forward, attn)
        yield
    finally:
        for attn, old in zip(attns, saved):
            del attn.forward
            if old is not None:
                attn.forward = old
