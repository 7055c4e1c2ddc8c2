"""Where continuation log-likelihoods are read: the residuals entering ``ln_final`` at the positions that predict
each continuation token, computed in batches of similar lengths (``prefill.padded_batches``).

- ``padded_rows``: each request's context and continuation as one right-padded sequence, TransformerLens's own
  blocks from the embedding (any model, any hooks).
- ``shared_context_rows``: each distinct context runs once (right-padded batch of contexts, keys and values
  kept), then the continuations of all its requests run on those keys and values, as rows of one batch: a
  multiple-choice question's options share the forward of its question. Exact up to float summation order; used
  for the engine's cached attention (rotary, causal, global) under no hooks or positionwise ones only (a hook
  that reads other positions would see the context and the continuation apart).

Both yield ``(request index per row, residual rows [rows, d_model], target token per row)`` chunk by chunk, and
declare the rows' positions on the call's ``PositionSource`` around every forward (``reach_lens.positions``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import Tensor
from transformer_lens import HookedTransformer

from reach_lens.generate.attention import Entry, block_device
from reach_lens.generate.prefill import padded_batches
from reach_lens.generate.types import LoglikRequest
from reach_lens.positions import PositionSource

Rows = tuple[list[int], Tensor, list[int]]


def padded_rows(model: HookedTransformer, source: PositionSource, requests: Sequence[LoglikRequest],
                batch_size: int) -> Iterator[Rows]:
    """Context + continuation of each request as one right-padded sequence, at most ``batch_size`` per forward."""
    device = model.embed.W_E.device
    sequences = [r.context + r.continuation for r in requests]
    for batch in padded_batches([len(s) for s in sequences]):
        for start in range(0, len(batch), batch_size):
            chunk = batch[start:start + batch_size]
            tokens, mask = _right_padded([sequences[s] for s in chunk], device)
            resid = _forward(model, source, tokens, mask)
            owners, rows, positions, targets = [], [], [], []
            for r, s in enumerate(chunk):
                n, end = len(requests[s].continuation), len(sequences[s])
                owners += [s] * n
                rows += [r] * n
                positions += range(end - n - 1, end - 1)
                targets += requests[s].continuation
            yield owners, resid[torch.tensor(rows, device=resid.device), torch.tensor(positions, device=resid.device)], \
                targets


def shared_context_rows(model: HookedTransformer, source: PositionSource, requests: Sequence[LoglikRequest],
                        batch_size: int) -> Iterator[Rows]:
    """Each distinct context once, then its requests' continuations on its keys and values (module docstring); a
    batch holds whole contexts, at most ``batch_size`` continuations (more only when one context has more)."""
    by_context: dict[tuple[int, ...], list[int]] = {}
    for i, r in enumerate(requests):
        by_context.setdefault(r.context, []).append(i)
    contexts = list(by_context)
    for group in padded_batches([len(c) for c in contexts]):
        batch: list[tuple[int, ...]] = []
        held = 0  # continuations in the batch
        for context in (contexts[c] for c in group):
            if batch and held + len(by_context[context]) > batch_size:
                yield from _continuations(model, source, requests, batch, by_context)
                batch, held = [], 0
            batch.append(context)
            held += len(by_context[context])
        if batch:
            yield from _continuations(model, source, requests, batch, by_context)


def _continuations(model: HookedTransformer, source: PositionSource, requests: Sequence[LoglikRequest],
                   contexts: list[tuple[int, ...]], by_context: dict[tuple[int, ...], list[int]]) -> Iterator[Rows]:
    device = model.embed.W_E.device
    tokens, mask = _right_padded(contexts, device)  # [C, p], contexts right-padded
    width = tokens.shape[1]
    resid = model.input_to_embed(tokens, attention_mask=mask)[0]
    kv = []
    with source.declare(torch.arange(width, device=device).expand(len(contexts), width), mask.sum(-1)):
        for layer, block in enumerate(model.blocks):
            entry = Entry.empty(model, len(contexts), width, block_device(model, layer))
            resid = block(resid.to(entry.keys.device), past_kv_cache_entry=entry,
                          attention_mask=torch.ones_like(mask, device=entry.keys.device))
            kv.append((entry.keys, entry.values))  # [C, kv_head, p, d_head] each
    last = resid[torch.arange(len(contexts), device=resid.device), mask.sum(-1).to(resid.device) - 1]  # [C, d_model]

    owners = [i for c in contexts for i in by_context[c]]
    context_row = torch.tensor([k for k, c in enumerate(contexts) for _ in by_context[c]], device=device)
    conts, cont_mask = _right_padded([requests[i].continuation for i in owners], device)  # [R, n]
    n = conts.shape[1]
    full_mask = torch.cat([mask[context_row], cont_mask], dim=1)  # [R, p + n]: padding after each context masked
    lengths = mask.sum(-1)[context_row]
    out = model.input_to_embed(conts, attention_mask=cont_mask)[0]
    with source.declare(lengths[:, None] + torch.arange(n, device=device), lengths + cont_mask.sum(-1)):
        for layer, block in enumerate(model.blocks):
            dev = block_device(model, layer)
            entry = Entry.empty(model, len(owners), width + n, dev)
            keys, values = kv[layer]
            entry.keys[:, :, :width] = keys[context_row.to(dev)]
            entry.values[:, :, :width] = values[context_row.to(dev)]
            entry.length = width
            out = block(out.to(dev), past_kv_cache_entry=entry, attention_mask=full_mask.to(dev))

    # the position before continuation token j: the context's last one for j = 0, the continuation's own j - 1 after
    before = torch.cat([last[context_row.to(last.device)][:, None].to(out.device), out], dim=1)  # [R, 1 + n, d_model]
    rows = torch.tensor([r for r, i in enumerate(owners) for _ in requests[i].continuation], device=out.device)
    positions = torch.tensor([j for i in owners for j in range(len(requests[i].continuation))], device=out.device)
    yield [i for i in owners for _ in requests[i].continuation], before[rows, positions], \
        [t for i in owners for t in requests[i].continuation]


def _right_padded(sequences: Sequence[Sequence[int]], device) -> tuple[Tensor, Tensor]:
    """Token ids ``[batch, longest]`` (0 after each sequence) and the mask of real tokens."""
    tokens = torch.zeros((len(sequences), max(len(s) for s in sequences)), dtype=torch.long, device=device)
    mask = torch.zeros_like(tokens)
    for r, s in enumerate(sequences):
        tokens[r, :len(s)] = torch.tensor(s, device=device)
        mask[r, :len(s)] = 1
    return tokens, mask


def _forward(model: HookedTransformer, source: PositionSource, tokens: Tensor, mask: Tensor) -> Tensor:
    """Residuals entering ``ln_final`` of right-padded sequences ``[batch, pos]``, each block run where its
    parameters live (so models split over devices work). Positioned hooks see the columns as positions and the
    padded width as every row's prompt length, as in an uncached forward of the batch outside the engine."""
    batch, width = tokens.shape
    with source.declare(torch.arange(width, device=tokens.device).expand(batch, width),
                        torch.full((batch,), width, device=tokens.device)):
        resid, _, shortformer, mask = model.input_to_embed(tokens, attention_mask=mask)
        for layer, block in enumerate(model.blocks):
            device = block_device(model, layer)
            resid = block(resid.to(device), attention_mask=mask.to(device),
                          shortformer_pos_embed=None if shortformer is None else shortformer.to(device))
    return resid
