"""Run layer routes: skip-only routes as a per-row mask in one batched forward, any route as a block loop.

A route is a list of layer indices run in order; the full path is [0, ..., L-1]. Skipping layer l of a
residual transformer is zeroing what its attention and MLP add to the residual stream, so skip-only
routes are hooks (`skip_mask_hooks`). Routes that repeat or reorder layers run through `run_path`,
which calls the model's own blocks in path order, with one KV-cache entry per path position.
"""
from typing import Optional, Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer, TransformerLensKeyValueCache, TransformerLensKeyValueCacheEntry
from transformer_lens.hook_points import HookPoint
from transformer_lens.utilities import apply_softcap
from transformer_lens.utilities.multi_gpu import get_device_for_block_index

from reach_lens.hooks import Hooks, is_skip_only, validate_route


def skip_mask(routes: Sequence[Sequence[int]], n_layers: int) -> Float[Tensor, "batch n_layers"]:
    """1 where a row's route runs the layer, 0 where it skips it; one skip-only route per row."""
    mask = torch.zeros(len(routes), n_layers)
    for row, route in enumerate(routes):
        route = validate_route(route, n_layers)
        if not is_skip_only(route):
            raise ValueError(f"route {list(route)} (row {row}) repeats or reorders layers; use run_path")
        mask[row, list(route)] = 1.0
    return mask


def skip_mask_hooks(routes: Sequence[Sequence[int]], n_layers: int) -> Hooks:
    """Run a different skip-only route in each batch row: `hook_attn_out` and `hook_mlp_out` of layer l
    are multiplied by the row's keep flag for l. One route is applied to every row.

    For B prompts x K routes, repeat each prompt K times (`tokens.repeat_interleave(K, 0)`) and pass
    `[r for _ in range(B) for r in routes]`. The mask is per row and position-independent, so it is
    exact under a KV cache. Layers that every route runs get no hook.
    """
    mask = skip_mask(routes, n_layers)
    hooks: Hooks = []
    for layer in range(n_layers):
        keep = mask[:, layer]
        if bool(keep.all()):
            continue

        def scale_rows(act: Tensor, hook: HookPoint, keep: Tensor = keep) -> Tensor:
            if keep.shape[0] not in (1, act.shape[0]):
                raise ValueError(f"{keep.shape[0]} routes for a batch of {act.shape[0]} rows")
            return act * keep.to(act)[:, None, None]

        hooks += [(f"blocks.{layer}.hook_attn_out", scale_rows), (f"blocks.{layer}.hook_mlp_out", scale_rows)]
    return hooks


def init_path_cache(model: HookedTransformer, path: Sequence[int], batch: int) -> TransformerLensKeyValueCache:
    """An empty KV cache with one entry per path position, so a repeated layer keeps separate keys/values."""
    path = validate_route(path, model.cfg.n_layers)
    return TransformerLensKeyValueCache(
        entries=[
            TransformerLensKeyValueCacheEntry.init_cache_entry(
                model.cfg, get_device_for_block_index(layer, model.cfg), batch)
            for layer in path
        ],
        previous_attention_mask=torch.empty((batch, 0), device=model.cfg.device, dtype=torch.int),
    )


def run_path(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    path: Sequence[int],
    cache: Optional[TransformerLensKeyValueCache] = None,
    attention_mask: Optional[Int[Tensor, "batch pos"]] = None,
) -> Float[Tensor, "batch pos d_vocab"]:
    """Logits of embed -> blocks in `path` order -> ln_final -> unembed, as `model.forward` does.

    `cache` (from `init_path_cache` for the same path) holds earlier positions; rotary positions come
    from its length. `attention_mask` covers the new tokens only, as in `model.forward`; a model
    without tokenizer needs it (all ones) when a cache is passed. Hooks on the blocks fire at every
    path position, so a repeated layer's hooks fire once per occurrence.
    """
    path = validate_route(path, model.cfg.n_layers)
    if cache is not None and len(cache.entries) != len(path):
        raise ValueError(f"cache has {len(cache.entries)} entries for a path of length {len(path)}; "
                         "build it with init_path_cache(model, path, batch)")
    residual, _, shortformer_pos_embed, attention_mask = model.input_to_embed(
        tokens, attention_mask=attention_mask, past_kv_cache=cache)
    for i, layer in enumerate(path):
        device = get_device_for_block_index(layer, model.cfg)
        residual = model.blocks[layer](
            residual.to(device),
            past_kv_cache_entry=None if cache is None else cache[i],
            shortformer_pos_embed=None if shortformer_pos_embed is None else shortformer_pos_embed.to(device),
            attention_mask=attention_mask,
        )
    if model.cfg.normalization_type is not None:
        residual = model.ln_final(residual)
    return apply_softcap(model.unembed(residual), model.cfg.output_logits_soft_cap)
