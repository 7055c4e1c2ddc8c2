"""Generate under many layer routes at once: per-route prefill with shared prefixes, batched decoding.

    gen = RouteGenerator(model, max_new_tokens=8)
    outs = gen([prompt_ids], [(0, (0, 1, 2, 3)), (0, (0, 2, 3)), (0, (0, 1, 1, 2, 3))])   # one per row

Prefill (compute-bound): each distinct (prompt, route) runs its own blocks at batch 1, but the layers a
route shares with the full path's start (or with the previous route in sorted order) are not recomputed:
a route that first deviates from (0, 1, ..., L-1) at position f starts from the clean residual and keys/values
of positions < f. The clean prefix of each prompt is computed once and kept (an LRU of `cache_prompts`).

Decode (memory-bound): rows of any routes and prompts run in one batch. The rows' routes are merged into
one schedule, a common supersequence of the routes (for non-decreasing routes: each layer as many times as
the route using it most), and a row's route is a subsequence of it. At a schedule slot the row does not use,
the block's output is discarded for that row (`where(keep, block(x), x)`), which makes the slot the identity,
exactly. Each slot has its own KV-cache entry, so a repeated layer keeps separate keys/values. Prompts of
different lengths are left-padded with an attention mask (rotary positions count each row's own tokens).
Rows leave the batch when they end.

Greedy decoding takes the argmax; with `temperature > 0` each row samples with its own `torch.Generator`
seeded by `seeds[row]`, so a row's tokens do not depend on the other rows (up to float rounding).
"""
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
from jaxtyping import Float
from torch import Tensor
from transformer_lens import HookedTransformer, TransformerLensKeyValueCache, TransformerLensKeyValueCacheEntry
from transformer_lens.utilities import apply_softcap

from reach_lens.hooks import validate_route
from reach_lens.routing.spaces import Path

Entry = TransformerLensKeyValueCacheEntry


@dataclass(frozen=True)
class RouteGeneration:
    """One continuation under one route. `token_logprobs` and `entropy` (mean over steps, nats) are of the
    untempered next-token distribution; `hidden` is the residual stream entering `ln_final` at the position
    that produced the last token; `text` is cut before the first stop string (None without a decoder)."""

    route: Path
    tokens: list[int]
    token_logprobs: list[float]
    entropy: float
    hidden: Float[Tensor, "d_model"]
    finish_reason: str
    text: Optional[str]

    @property
    def mean_logprob(self) -> float:
        return sum(self.token_logprobs) / len(self.token_logprobs)


def schedule(routes: Sequence[Path]) -> tuple[list[int], list[list[int]]]:
    """A common supersequence of `routes` and, per route, the schedule slots its positions use."""
    if all(all(a <= b for a, b in zip(r, r[1:])) for r in routes):
        most: dict[int, int] = {}
        for r in routes:
            for layer in set(r):
                most[layer] = max(most.get(layer, 0), r.count(layer))
        sched = [layer for layer in sorted(most) for _ in range(most[layer])]
    else:
        sched = []
        for r in dict.fromkeys(routes):
            sched = _supersequence(sched, list(r))
    slots = []
    for r in routes:
        j, used = 0, []
        for layer in r:
            while sched[j] != layer:
                j += 1
            used.append(j)
            j += 1
        slots.append(used)
    return sched, slots


def _supersequence(a: list[int], b: list[int]) -> list[int]:
    """A shortest common supersequence of a and b (via their longest common subsequence)."""
    n, m = len(a), len(b)
    lcs = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            lcs[i][j] = lcs[i + 1][j + 1] + 1 if a[i] == b[j] else max(lcs[i + 1][j], lcs[i][j + 1])
    out, i, j = [], 0, 0
    while i < n and j < m:
        if a[i] == b[j]:
            out.append(a[i]); i += 1; j += 1
        elif lcs[i + 1][j] >= lcs[i][j + 1]:
            out.append(a[i]); i += 1
        else:
            out.append(b[j]); j += 1
    return out + a[i:] + b[j:]


def _is_clean(prefix: Path) -> bool:
    return all(layer == i for i, layer in enumerate(prefix))


@dataclass
class _Prefilled:
    entries: list[Entry]  # one per route position, [1, prompt_len, kv_head, d_head]
    hidden: Tensor  # [d_model], last prompt position entering ln_final
    logits: Tensor  # [d_vocab]


class RouteGenerator:
    """Continuations of prompts under layer routes (see the module docstring).

    A row ends at a token of `stop_token_ids` (default: the tokenizer's EOS), when its decoded text holds
    one of `stop_strings`, or after `max_new_tokens`. `decode_fn` defaults to the tokenizer's decode.
    """

    def __init__(self, model: HookedTransformer, max_new_tokens: int, stop_strings: Sequence[str] = (),
                 stop_token_ids: Optional[Sequence[int]] = None,
                 decode_fn: Optional[Callable[[list[int]], str]] = None, batch_size: int = 16,
                 cache_prompts: int = 64):
        if max_new_tokens < 1 or batch_size < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens}, batch_size={batch_size}; both must be >= 1")
        tokenizer = model.tokenizer
        if stop_token_ids is None:
            eos = getattr(tokenizer, "eos_token_id", None)
            stop_token_ids = () if eos is None else (eos,)
        if decode_fn is None and tokenizer is not None:
            decode_fn = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
        if stop_strings and decode_fn is None:
            raise ValueError("stop_strings need a decode_fn (the model has no tokenizer)")
        self.model, self.max_new_tokens, self.batch_size = model, max_new_tokens, batch_size
        self.stop_strings, self.stop_ids, self.decode = tuple(s for s in stop_strings if s), set(stop_token_ids), decode_fn
        self.cache_prompts = cache_prompts
        self._clean: OrderedDict[tuple[int, ...], tuple[list[Tensor], list[Entry]]] = OrderedDict()

    # ---- prefill ---------------------------------------------------------------------------------

    def _block(self, layer: int, resid: Float[Tensor, "batch pos d_model"]) -> tuple[Tensor, Entry]:
        """Block `layer` over `resid` (rows of one prompt, no padding), with a fresh cache entry."""
        entry = Entry.init_cache_entry(self.model.cfg, resid.device, resid.shape[0])
        ones = torch.ones(resid.shape[:2], dtype=torch.long, device=resid.device)
        return self.model.blocks[layer](resid, past_kv_cache_entry=entry, attention_mask=ones), entry

    def _clean_prefix(self, prompt: tuple[int, ...]) -> tuple[list[Tensor], list[Entry]]:
        """Residuals entering each layer (and leaving the last) and keys/values of the full path."""
        if prompt in self._clean:
            self._clean.move_to_end(prompt)
            return self._clean[prompt]
        tokens = torch.tensor([prompt], dtype=torch.long, device=self.model.cfg.device)
        resid, _, _, _ = self.model.input_to_embed(tokens, attention_mask=torch.ones_like(tokens))
        resids, entries = [resid], []
        for layer in range(self.model.cfg.n_layers):
            resid, entry = self._block(layer, resid)
            resids.append(resid)
            entries.append(entry)
        self._clean[prompt] = (resids, entries)
        while len(self._clean) > self.cache_prompts:
            self._clean.popitem(last=False)
        return resids, entries

    def _prefill(self, prompt: tuple[int, ...], routes: Sequence[Path]) -> dict[Path, _Prefilled]:
        """Prefill of each route, sharing computation along the trie of route prefixes: a prefix that is
        the full path's start is the clean prefix; the other prefixes are computed depth by depth, and the
        prefixes of one depth ending in the same layer run as one batch."""
        clean_resids, clean_entries = self._clean_prefix(prompt)
        routes = list(dict.fromkeys(routes))
        clean_len = {r: next((i for i, layer in enumerate(r) if layer != i), len(r)) for r in routes}
        todo = sorted({r[:i] for r in routes for i in range(clean_len[r] + 1, len(r) + 1)}, key=len)
        resid: dict[Path, Tensor] = {}  # computed prefixes of the previous and current depth
        entry: dict[Path, Entry] = {}
        last: dict[Path, Tensor] = {}  # [d_model]: last prompt position after a whole route
        for r in routes:
            if clean_len[r] == len(r):
                last[r] = clean_resids[len(r)][0, -1]
        for depth in sorted({len(p) for p in todo}):
            level = [p for p in todo if len(p) == depth]
            for layer in sorted({p[-1] for p in level}):
                group = [p for p in level if p[-1] == layer]
                parents = [clean_resids[depth - 1] if _is_clean(p[:-1]) else resid[p[:-1]] for p in group]
                out, batch_entry = self._block(layer, torch.cat(parents))
                for g, p in enumerate(group):
                    resid[p] = out[g:g + 1]
                    entry[p] = Entry(past_keys=batch_entry.past_keys[g:g + 1], past_values=batch_entry.past_values[g:g + 1])
                    if p in clean_len:
                        last[p] = out[g, -1].clone()
            for p in [p for p in resid if len(p) < depth]:
                del resid[p]
        names = list(last)
        logits = self._logits(torch.stack([last[r] for r in names])[:, None])
        return {r: _Prefilled([clean_entries[i] if i < clean_len[r] else entry[r[:i + 1]] for i in range(len(r))],
                              last[r], logits[j])
                for j, r in enumerate(names)}

    def _logits(self, resid: Float[Tensor, "batch 1 d_model"]) -> Float[Tensor, "batch d_vocab"]:
        model = self.model
        x = model.ln_final(resid) if model.cfg.normalization_type is not None else resid
        return apply_softcap(model.unembed(x), model.cfg.output_logits_soft_cap)[:, 0].float()

    # ---- decode ----------------------------------------------------------------------------------

    def __call__(self, prompts: Sequence[Sequence[int]], rows: Sequence[tuple[int, Sequence[int]]],
                 temperature: float = 0.0, seeds: Optional[Sequence[int]] = None) -> list[RouteGeneration]:
        """One generation per row (prompt index, route), in row order."""
        n_layers, vocab = self.model.cfg.n_layers, self.model.cfg.d_vocab
        prompts = [tuple(int(t) for t in p) for p in prompts]
        for i, p in enumerate(prompts):
            if not p or not all(0 <= t < vocab for t in p):
                raise ValueError(f"prompt {i} is empty or has token ids outside 0..{vocab - 1}")
            if len(p) + self.max_new_tokens > self.model.cfg.n_ctx:
                raise ValueError(f"prompt {i} of {len(p)} tokens + max_new_tokens {self.max_new_tokens} "
                                 f"exceeds n_ctx={self.model.cfg.n_ctx}")
        rows = [(int(p), validate_route(r, n_layers)) for p, r in rows]
        bad = [p for p, _ in rows if not 0 <= p < len(prompts)]
        if bad:
            raise ValueError(f"row prompt index {bad[0]} out of range (0..{len(prompts) - 1})")
        if temperature < 0 or (temperature > 0 and (seeds is None or len(seeds) != len(rows))):
            raise ValueError(f"temperature {temperature}: expected >= 0, and > 0 needs one seed per row "
                             f"({len(rows)} rows, {None if seeds is None else len(seeds)} seeds)")
        gens = [torch.Generator().manual_seed(int(s)) for s in seeds] if temperature > 0 else [None] * len(rows)
        order = sorted(range(len(rows)), key=lambda i: (rows[i][0], rows[i][1]))
        out: list[Optional[RouteGeneration]] = [None] * len(rows)
        with torch.no_grad():
            for start in range(0, len(order), self.batch_size):
                chunk = order[start:start + self.batch_size]
                for i, g in zip(chunk, self._run(prompts, [rows[i] for i in chunk], temperature,
                                                 [gens[i] for i in chunk])):
                    out[i] = g
        return out  # type: ignore[return-value]

    def _choose(self, logits: Tensor, temperature: float, gens: list) -> tuple[list[int], Tensor, Tensor]:
        logp = torch.log_softmax(logits, dim=-1)
        entropy = -(logp.exp() * logp).sum(-1)
        if temperature == 0:
            tokens = logits.argmax(-1).tolist()
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            tokens = [int(torch.multinomial(probs[b], 1, generator=g)) for b, g in enumerate(gens)]
        chosen = logp[torch.arange(len(tokens)), torch.tensor(tokens)]
        return tokens, chosen, entropy

    def _finished(self, tokens: list[int]) -> tuple[Optional[str], Optional[str]]:
        """(finish reason or None, text cut at a stop string)."""
        text = self.decode(tokens) if self.decode is not None else None
        if tokens[-1] in self.stop_ids:
            return "eos", text
        if text is not None and self.stop_strings:
            cuts = [text.find(s) for s in self.stop_strings if s in text]
            if cuts:
                return "stop", text[:min(cuts)]
        return ("length" if len(tokens) >= self.max_new_tokens else None), text

    def _run(self, prompts, rows, temperature, gens) -> list[RouteGeneration]:
        by_prompt: dict[int, list[Path]] = {}
        for p, r in rows:
            by_prompt.setdefault(p, []).append(r)
        pre = {p: self._prefill(prompts[p], routes) for p, routes in by_prompt.items()}
        first = [pre[p][r] for p, r in rows]
        tokens, logp, ent = self._choose(torch.stack([f.logits for f in first]), temperature, gens)
        state = [{"tokens": [t], "logprobs": [float(l)], "entropies": [float(e)], "hidden": f.hidden}
                 for t, l, e, f in zip(tokens, logp, ent, first)]
        done: dict[int, tuple[str, Optional[str]]] = {}
        for b, s in enumerate(state):
            reason, text = self._finished(s["tokens"])
            if reason is not None:
                done[b] = (reason, text)
        live = [b for b in range(len(rows)) if b not in done]
        if live:
            self._decode(prompts, rows, first, state, done, live, temperature, gens)
        return [RouteGeneration(rows[b][1], s["tokens"], s["logprobs"], sum(s["entropies"]) / len(s["entropies"]),
                                s["hidden"], done[b][0], done[b][1]) for b, s in enumerate(state)]

    def _decode(self, prompts, rows, first, state, done, live, temperature, gens) -> None:
        cfg, device = self.model.cfg, self.model.cfg.device
        sched, slots = schedule([rows[b][1] for b in live])
        lengths = [len(prompts[rows[b][0]]) for b in live]
        width = max(lengths)
        keep = torch.zeros(len(live), len(sched), dtype=torch.bool, device=device)
        kv_heads = cfg.n_key_value_heads or cfg.n_heads
        entries = []
        for j in range(len(sched)):
            keys = torch.zeros(len(live), width, kv_heads, cfg.d_head, dtype=cfg.dtype, device=device)
            entries.append(Entry(past_keys=keys, past_values=keys.clone()))
        for row, (b, used) in enumerate(zip(live, slots)):
            n = lengths[row]
            for i, j in enumerate(used):
                keep[row, j] = True
                entries[j].past_keys[row, width - n:] = first[b].entries[i].past_keys[0]
                entries[j].past_values[row, width - n:] = first[b].entries[i].past_values[0]
        mask = (torch.arange(width, device=device)[None, :] >= width - torch.tensor(lengths, device=device)[:, None]).long()
        cache = TransformerLensKeyValueCache(entries=entries, previous_attention_mask=mask)
        while live:
            last = torch.tensor([[state[b]["tokens"][-1]] for b in live], dtype=torch.long, device=device)
            resid, _, shortformer, attn_mask = self.model.input_to_embed(
                last, attention_mask=torch.ones_like(last), past_kv_cache=cache)
            for j, layer in enumerate(sched):
                post = self.model.blocks[layer](resid, shortformer_pos_embed=shortformer,
                                                past_kv_cache_entry=entries[j], attention_mask=attn_mask)
                resid = torch.where(keep[:, j, None, None], post, resid)
            tokens, logp, ent = self._choose(self._logits(resid), temperature, [gens[b] for b in live])
            stay = []
            for row, b in enumerate(live):
                s = state[b]
                s["tokens"].append(tokens[row]); s["logprobs"].append(float(logp[row]))
                s["entropies"].append(float(ent[row])); s["hidden"] = resid[row, -1]
                reason, text = self._finished(s["tokens"])
                if reason is None:
                    stay.append(row)
                else:
                    done[b] = (reason, text)
            if len(stay) < len(live):
                idx = torch.tensor(stay, dtype=torch.long, device=device)
                for e in entries:
                    e.past_keys, e.past_values = e.past_keys[idx], e.past_values[idx]
                cache.previous_attention_mask = cache.previous_attention_mask[idx]
                keep = keep[idx]
                live = [live[row] for row in stay]
