"""Prompt prefill under routes and hooks, sharing every computation that cannot differ.

Four kinds of sharing, all exact:

- **clean prefix**: blocks before the first hooked layer ``h`` compute the same thing with or without the
  call's hooks. For each prompt, the residual entering every block and the keys/values of every block of
  the *unhooked full path* are kept (``PrefixCache``, an LRU bounded in bytes, valid while the model's
  parameters and modules are unchanged), so a call whose hooks start at layer ``h``, or a route that
  first leaves the full path at position ``f``, prefills only from position ``min(h, f)`` on.
- **shared tokens**: a prompt whose first tokens are a cached prompt (a few-shot block every question of a
  task starts with) computes its clean prefix only for the tokens after them, attending to the cached keys
  and values (attention is causal, so the first tokens' residuals and keys are the cached ones). Before a
  call, the longest token prefix common to all its prompts is prefilled once as such an entry
  (``share_common_prefix``), so the block is computed once per model, not once per question. The extending
  entry keeps only its own positions and refers to the entry it extends (``CleanPrefix.base``): the shared
  tokens' residuals and keys exist once in memory, however many prompts extend them, and a prefill hands the
  decode loop its keys and values as consecutive pieces (``Pieces``: the shared ones, then its own), copied
  once, into the row's decode cache.
- **shared tokens under hooks**: when every hook of the call is ``positionwise`` (``reach_lens.hooks``), the
  blocks from the first hooked layer on also run that common prefix once per call, under the hooks, and each
  prompt of the full path computes only its own tokens there, attending to the prefix's hooked keys and values
  (a positionwise hook does to the prefix's positions what it would do inside every prompt).
- **route trie**: routes of one prompt that share their first layers share those positions: the
  prefixes of a depth that end in the same layer run as one batch, each on its parent's residual.

The K rows of one (prompt, route) share one prefill (the loop copies it into K decode slots).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor
from transformer_lens import HookedTransformer
from transformer_lens.utilities import apply_softcap

from reach_lens.generate.attention import Entry, block_device
from reach_lens.generate.types import TokenIds
from reach_lens.positions import PositionSource
from reach_lens.routes import LayerRoute

PADDING_WASTE = 0.25  # a right-padded prefill batch computes at most this share of its real tokens again as padding
# attention scores (prompts x heads x queries x keys) of one prefill block call, at most (unless one prompt alone
# has more): 16 MB in float32, which keeps the scores and their softmax in cache (docs/engines.md)
SCORES_BUDGET = 1 << 22

KV = tuple[Tensor, Tensor]  # keys and values of consecutive positions, [kv_head, n, d_head] each
Pieces = tuple[KV, ...]  # one block's keys and values of a prompt, as consecutive pieces (shared ones first)


@dataclass(eq=False)
class CleanPrefix:
    """One prompt (``tokens``) run without hooks along the full path through its first ``depth`` blocks.

    ``base``: the clean prefix of its first ``start`` tokens (a cached prompt it extends, e.g. a few-shot block),
    or None (``start`` 0); only the positions after them are stored here: ``resid[d]``: ``[1, n - start,
    d_model]`` entering block d (d = 0..depth); ``kv[d]``: keys and values of block d, ``[kv_head, n - start,
    d_head]`` each (d < depth). A base is at least as deep as what extends it (``Prefiller._extend``).
    """

    tokens: TokenIds
    resid: list[Tensor]
    kv: list[KV]
    base: CleanPrefix | None = None

    @property
    def depth(self) -> int:
        return len(self.kv)

    @property
    def start(self) -> int:
        return 0 if self.base is None else len(self.base.tokens)

    @property
    def nbytes(self) -> int:
        """Bytes of the positions stored here (not the base's)."""
        return sum(t.numel() * t.element_size() for t in self.resid) + sum(
            k.numel() * k.element_size() * 2 for k, _ in self.kv)

    def residual(self, d: int, since: int = 0) -> Float[Tensor, "1 pos d_model"]:
        """The residual entering block ``d`` at positions ``since`` .. n-1 (the base's positions concatenated in
        front of this entry's own when they are asked for: a copy, made only then)."""
        if since >= self.start:
            return self.resid[d][:, since - self.start:]
        return torch.cat([self.base.residual(d, since).to(self.resid[d].device), self.resid[d]], dim=1)

    def pieces(self, d: int) -> Pieces:
        """Keys and values of block ``d`` at every position of the prompt, as consecutive pieces (no copy)."""
        return (self.base.pieces(d) if self.base is not None else ()) + (self.kv[d],)


class PrefixCache:
    """Clean prefixes by prompt, least recently used evicted beyond ``max_bytes``.

    Entries are valid for one ``stamp`` (the model's parameters, modules and attention implementation):
    a call with another stamp empties the cache first. An entry counts the bytes it stores itself; the entry
    it extends (its ``base``) is kept in the cache, and used whenever it is, so a base outlives what
    extends it and its positions are never held twice.
    """

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.entries: OrderedDict[TokenIds, CleanPrefix] = OrderedDict()
        self.sizes: dict[TokenIds, int] = {}  # bytes of each entry when it was last put (entries grow in depth)
        self.stamp: Hashable = None
        self.bytes = 0

    def validate(self, stamp: Hashable) -> None:
        if stamp != self.stamp:
            self.clear()
            self.stamp = stamp

    def clear(self) -> None:
        self.entries.clear()
        self.sizes.clear()
        self.bytes = 0

    def get(self, prompt: TokenIds) -> CleanPrefix | None:
        found = self.entries.get(prompt)
        if found is not None:
            self._touch(found)
        return found

    def longest_prefix(self, prompt: TokenIds) -> TokenIds | None:
        """The longest cached prompt that is a proper prefix of ``prompt`` (its first tokens), or None."""
        best = None
        for key in self.entries:
            if len(key) < len(prompt) and (best is None or len(key) > len(best)) and prompt[: len(key)] == key:
                best = key
        return best

    def put(self, prompt: TokenIds, prefix: CleanPrefix) -> None:
        """Keep (or re-count, after it grew) ``prefix`` as the entry of ``prompt``, and its bases after it: an entry
        is evicted before the entries it extends."""
        self._drop(prompt)
        self._add(prompt, prefix)
        base = prefix.base
        while base is not None:
            cached = self.entries.get(base.tokens)
            if cached is base:
                self._drop(base.tokens)  # re-counted and most recently used
            if cached is base or cached is None:
                self._add(base.tokens, base)
            base = base.base
        while self.bytes > self.max_bytes:
            evicted, _ = self.entries.popitem(last=False)
            self.bytes -= self.sizes.pop(evicted)

    def _add(self, prompt: TokenIds, prefix: CleanPrefix) -> None:
        size = prefix.nbytes
        if size <= self.max_bytes:
            self.entries[prompt] = prefix
            self.sizes[prompt] = size
            self.bytes += size

    def _touch(self, prefix: CleanPrefix) -> None:
        """Mark ``prefix`` and then its bases most recently used."""
        while prefix is not None:
            if self.entries.get(prefix.tokens) is prefix:
                self.entries.move_to_end(prefix.tokens)
            prefix = prefix.base

    def _drop(self, prompt: TokenIds) -> None:
        if prompt in self.entries:
            del self.entries[prompt]
            self.bytes -= self.sizes.pop(prompt)


@dataclass
class Prefilled:
    """One (prompt, route) after its prompt: keys/values per route position (``Pieces`` covering the prompt's
    positions, each ``[kv_head, n_i, d_head]``), the residual entering ``ln_final`` at the last prompt position
    (``[d_model]``) and the next-token logits (``[d_vocab]``)."""

    kv: list[Pieces]
    hidden: Tensor
    logits: Tensor


def padded_batches(lengths: Sequence[int], waste: float = PADDING_WASTE) -> list[list[int]]:
    """Indices of ``lengths`` grouped for right-padded batches, longest first: a batch closes when padding it to
    its longest member would add more than ``waste`` of its real tokens (so a batch costs at most ``1 + waste``
    times its tokens, however many prompts it holds)."""
    batches: list[list[int]] = []
    tokens = 0  # real tokens of the last batch
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if batches and lengths[batches[-1][0]] * (len(batches[-1]) + 1) <= (1 + waste) * (tokens + lengths[i]):
            batches[-1].append(i)
            tokens += lengths[i]
        else:
            batches.append([i])
            tokens = lengths[i]
    return batches


def budgeted_batches(lengths: Sequence[int], past: int, n_heads: int, budget: int = SCORES_BUDGET) -> list[list[int]]:
    """``padded_batches(lengths)``, each cut into runs of prompts whose attention scores (prompts x ``n_heads`` x the
    batch's longest length x (``past`` + it), one block's) stay within ``budget`` elements (at least one prompt a
    run). Past a few million scores a batch runs slower per token on the CPU, not faster: the score tensors and
    their softmax leave the caches, and every step allocates them afresh."""
    out = []
    for batch in padded_batches(lengths):
        longest = lengths[batch[0]]
        step = max(1, budget // max(1, n_heads * longest * (past + longest)))
        out += [batch[i:i + step] for i in range(0, len(batch), step)]
    return out


def clean_length(route: LayerRoute) -> int:
    """How many first positions of ``route`` are the full path's (0, 1, 2, ...)."""
    return next((i for i, layer in enumerate(route) if layer != i), len(route))


class Prefiller:
    """Prefills of the (prompt, route) pairs of one engine call (see the module docstring).

    ``source`` is the call's position source, on which every forward declares its rows' positions;
    ``hooked_from`` is the first layer any hook of the call can touch (-1: the embedding is hooked; L: only
    ``ln_final``/unembed or nothing), ``share`` turns every kind of sharing off when False (a reference),
    ``positionwise_hooks`` says every hook the call runs is positionwise, or that it runs none (then full-path
    prefills are batched, and a common prefix runs once under the hooks).
    """

    def __init__(self, model: HookedTransformer, source: PositionSource, cache: PrefixCache | None, hooked_from: int,
                 share: bool = True, positionwise_hooks: bool = False):
        self.model, self.source, self.cache, self.hooked_from, self.share = model, source, cache, hooked_from, share
        self.n_layers = model.cfg.n_layers
        self.positionwise_hooks = positionwise_hooks
        self.hooked_prefix: tuple[TokenIds, list[KV]] | None = None  # tokens, kv of hooked blocks

    # ---- pieces ---------------------------------------------------------------------------------

    def _device(self, layer: int) -> torch.device:
        return block_device(self.model, layer)

    def _embed(self, prompt: TokenIds) -> Tensor:
        tokens = torch.tensor([prompt], dtype=torch.long, device=self.model.embed.W_E.device)
        resid, _, _, _ = self.model.input_to_embed(tokens, attention_mask=torch.ones_like(tokens))
        return resid

    def _block(self, layer: int, resid: Float[Tensor, "batch pos d_model"],
               past: Pieces | None = None) -> tuple[Tensor, Entry]:
        """Block ``layer`` over rows of one prompt (several rows when route prefixes share a depth), or over the
        right-padded own tokens of several prompts after a common prefix (``full_paths``, positionwise hooks
        only), with a fresh cache entry; positioned hooks see every row at the prompt's positions. ``past``: keys
        and values of the first p tokens, which every row of ``resid`` continues (``Pieces``, in order)."""
        device = self._device(layer)
        batch, n = resid.shape[:2]
        start = 0 if past is None else sum(keys.shape[1] for keys, _ in past)
        entry = Entry.empty(self.model, batch, start + n, device)
        for keys, values in past or ():
            entry.append(keys.transpose(0, 1)[None], values.transpose(0, 1)[None])
        ones = torch.ones((batch, start + n), dtype=torch.long, device=device)
        positions = torch.arange(start, start + n, device=device).expand(batch, n)
        with self.source.declare(positions, torch.full((batch,), start + n, device=device)):
            out = self.model.blocks[layer](resid.to(device), past_kv_cache_entry=entry, attention_mask=ones)
        return out, entry

    def _batches(self, lengths: Sequence[int], past: int) -> list[list[int]]:
        return budgeted_batches(lengths, past, self.model.cfg.n_heads, SCORES_BUDGET)

    def _clean(self, prompt: TokenIds, depth: int) -> CleanPrefix:
        """The clean prefix of ``prompt`` through ``depth`` blocks, from the cache or extended there; a prompt not
        cached extends the longest cached prompt its tokens start with, when there is one (``CleanPrefix.base``)."""
        found = self.cache.get(prompt) if self.cache is not None else None
        if found is None:
            shared = self.cache.longest_prefix(prompt) if self.cache is not None else None
            base = self._clean(shared, depth) if shared is not None else None
            start = 0 if base is None else len(base.tokens)
            found = CleanPrefix(prompt, [self._embed(prompt)[:, start:].clone()], [], base)
        self._extend(found, depth)
        return found

    def _extend(self, prefix: CleanPrefix, depth: int) -> None:
        """Run ``prefix``'s own positions through its blocks up to ``depth`` (its base first), and cache it."""
        if prefix.depth < depth:
            if prefix.base is not None:
                self._extend(prefix.base, depth)
            for layer in range(prefix.depth, depth):
                past = None if prefix.base is None else prefix.base.pieces(layer)
                out, entry = self._block(layer, prefix.resid[-1], past=past)
                keys, values = entry.row(0)
                prefix.resid.append(out)
                prefix.kv.append((keys[:, prefix.start:].clone(), values[:, prefix.start:].clone()))
        if self.cache is not None:
            self.cache.put(prefix.tokens, prefix)

    def _clean_many(self, prompts: Sequence[TokenIds], depth: int) -> list[CleanPrefix]:
        """``_clean`` of several prompts: those with nothing cached that extend the same cached prompt (or none) run
        their own tokens through the first ``depth`` blocks in right-padded batches of similar lengths."""
        found: dict[TokenIds, CleanPrefix] = {}
        groups: dict[TokenIds | None, list[TokenIds]] = {}
        for p in dict.fromkeys(prompts):
            cached = self.cache.get(p) if self.cache is not None else None
            if cached is not None:
                found[p] = self._clean(p, depth)
            else:
                groups.setdefault(self.cache.longest_prefix(p) if self.cache is not None else None, []).append(p)
        for base, members in groups.items():
            clean = self._clean(base, depth) if base is not None else None
            start = 0 if base is None else len(base)
            for batch in self._batches([len(p) - start for p in members], start):
                chosen = [members[i] for i in batch]
                found.update(zip(chosen, self._clean_batch(chosen, clean, depth)))
        return [found[p] for p in prompts]

    def _clean_batch(self, prompts: Sequence[TokenIds], base: CleanPrefix | None, depth: int) -> list[CleanPrefix]:
        """Clean prefixes of ``prompts`` that all extend ``base`` (None: from their first token), their own tokens
        right-padded into one batch; each is cached."""
        start = 0 if base is None else len(base.tokens)
        prefixes = [CleanPrefix(p, [self._embed(p)[:, start:].clone()], [], base) for p in prompts]
        lengths = [len(p) - start for p in prompts]
        resid = torch.nn.utils.rnn.pad_sequence([c.resid[0][0] for c in prefixes], batch_first=True)
        for layer in range(depth):
            resid, entry = self._block(layer, resid, past=None if base is None else base.pieces(layer))
            for b, (prefix, n) in enumerate(zip(prefixes, lengths)):
                keys, values = entry.row(b)
                prefix.kv.append((keys[:, start:start + n].clone(), values[:, start:start + n].clone()))
                prefix.resid.append(resid[b:b + 1, :n].clone())
        if self.cache is not None:
            for p, prefix in zip(prompts, prefixes):
                self.cache.put(p, prefix)
        return prefixes

    def share_common_prefix(self, prompts: Sequence[TokenIds], min_tokens: int = 16) -> None:
        """Prefill the longest token prefix common to ``prompts`` (at least two distinct ones) as a cache entry, so
        that each prompt's clean prefix is computed only after it (module docstring). Nothing happens without a
        cache, under a hooked embedding, or when the common prefix is shorter than ``min_tokens``."""
        distinct = list(dict.fromkeys(prompts))
        if self.cache is None or not self.share or self.hooked_from < 0 or len(distinct) < 2:
            return
        common = 0
        shortest = min(distinct, key=len)
        while common < len(shortest) and all(p[common] == shortest[common] for p in distinct):
            common += 1
        if common < min_tokens:
            return
        clean = self._clean(shortest[:common], min(self.hooked_from, self.n_layers))
        if self.positionwise_hooks and self.hooked_from < self.n_layers and common < len(shortest):
            resid, kv = clean.residual(self.hooked_from), []
            for layer in range(self.hooked_from, self.n_layers):
                resid, entry = self._block(layer, resid)
                kv.append(entry.row(0))
            self.hooked_prefix = (shortest[:common], kv)

    def logits(self, resid: Float[Tensor, "batch d_model"]) -> Float[Tensor, "batch d_vocab"]:
        """Next-token logits from residuals entering ``ln_final`` (hooks on ln_final/unembed fire)."""
        model = self.model
        x = resid[:, None].to(model.unembed.W_U.device)
        if model.cfg.normalization_type is not None:
            x = model.ln_final(x)
        return apply_softcap(model.unembed(x), model.cfg.output_logits_soft_cap)[:, 0]

    # ---- one prompt, many routes ----------------------------------------------------------------

    def __call__(self, prompt: TokenIds, routes: Sequence[LayerRoute]) -> dict[LayerRoute, Prefilled]:
        """Prefill of every route of ``prompt`` (routes given as layer tuples; the full path included as such)."""
        routes = list(dict.fromkeys(routes))
        n = len(prompt)
        device = self.model.embed.W_E.device
        with self.source.declare(torch.arange(n, device=device)[None], torch.tensor([n], device=device)):  # embed, unembed
            if not self.share:
                return {r: self._alone(prompt, r) for r in routes}
            return self._shared(prompt, routes)

    def batched_full_path(self, prompt: TokenIds, routes: Sequence[LayerRoute]) -> bool:
        """Whether ``prompt``'s prefill of ``routes`` is a full path that ``full_paths`` computes together with other
        prompts: under positionwise hooks after the call's hooked common prefix, or under no hooked block at all
        (the decode loop asks before calling)."""
        if not (self.share and self.positionwise_hooks) or list(routes) != [tuple(range(self.n_layers))]:
            return False
        if self.hooked_prefix is None:
            return self.hooked_from >= self.n_layers
        tokens = self.hooked_prefix[0]
        return len(prompt) > len(tokens) and prompt[:len(tokens)] == tokens

    def full_paths(self, prompts: Sequence[TokenIds]) -> list[Prefilled]:
        """Full-path prefills of prompts for which ``batched_full_path`` holds: the clean blocks from the cache or
        computed in batches (``_clean_many``), the hooked ones over the prompts' own tokens after the hooked
        prefix, in right-padded batches of prompts of similar lengths (``padded_batches``; a row's real positions
        never attend to the padding after them)."""
        if self.hooked_prefix is None:  # no hooked block
            cleans = self._clean_many(prompts, self.n_layers)
            hidden = torch.stack([c.resid[self.n_layers][0, -1].to(self.model.unembed.W_U.device) for c in cleans])
            logits = self.logits(hidden)
            return [Prefilled([c.pieces(d) for d in range(self.n_layers)], hidden[b], logits[b])
                    for b, c in enumerate(cleans)]
        c = len(self.hooked_prefix[0])
        out: dict[int, Prefilled] = {}
        for batch in self._batches([len(p) - c for p in prompts], c):
            out.update(zip(batch, self._full_paths_batch([prompts[i] for i in batch])))
        return [out[i] for i in range(len(prompts))]

    def _full_paths_batch(self, prompts: Sequence[TokenIds]) -> list[Prefilled]:
        tokens, hooked_kv = self.hooked_prefix
        c, h = len(tokens), self.hooked_from
        cleans = self._clean_many(prompts, h)
        own = [clean.residual(h, since=c)[0] for clean in cleans]  # [n_i, d_model] each
        lengths = [len(o) for o in own]
        resid = torch.nn.utils.rnn.pad_sequence(own, batch_first=True)  # [batch, max n_i, d_model]
        kvs = [[clean.pieces(d) for d in range(h)] for clean in cleans]
        for layer in range(h, self.n_layers):
            shared = hooked_kv[layer - h]
            resid, entry = self._block(layer, resid, past=(shared,))
            for b, n in enumerate(lengths):
                keys, values = entry.row(b)
                kvs[b].append((shared, (keys[:, c:c + n].clone(), values[:, c:c + n].clone())))
        rows = torch.arange(len(prompts), device=resid.device)
        hidden = resid[rows, torch.tensor(lengths, device=resid.device) - 1]
        logits = self.logits(hidden)
        return [Prefilled(kv, hidden[b], logits[b]) for b, kv in enumerate(kvs)]

    def _start(self, route: LayerRoute) -> int:
        """Positions of ``route`` served by the clean prefix."""
        return min(clean_length(route), self.hooked_from) if self.hooked_from >= 0 else 0

    def _shared(self, prompt: TokenIds, routes: list[LayerRoute]) -> dict[LayerRoute, Prefilled]:
        start = {r: self._start(r) for r in routes}
        clean = self._clean(prompt, max(start.values())) if self.hooked_from >= 0 else None
        embedded = self._embed(prompt) if clean is None else None  # the embedding itself is hooked
        todo = sorted({r[:i] for r in routes for i in range(start[r] + 1, len(r) + 1)}, key=len)
        resid: dict[LayerRoute, Tensor] = {}
        kv: dict[LayerRoute, KV] = {}
        last: dict[LayerRoute, Tensor] = {}
        for r in routes:
            if start[r] == len(r):
                last[r] = clean.resid[len(r)][0, -1]  # a prompt's own positions include its last
        for depth in sorted({len(p) for p in todo}):
            level = [p for p in todo if len(p) == depth]
            for layer in sorted({p[-1] for p in level}):
                group = [p for p in level if p[-1] == layer]
                parents = [self._parent(p, clean, embedded, resid) for p in group]
                out, entry = self._block(layer, torch.cat(parents))
                for g, p in enumerate(group):
                    resid[p] = out[g:g + 1]
                    kv[p] = entry.row(g)
                    if p in start:
                        last[p] = out[g, -1]
            for p in [p for p in resid if len(p) < depth]:
                del resid[p]
        logits = self.logits(torch.stack([last[r].to(self.model.unembed.W_U.device) for r in routes]))
        out = {}
        for j, r in enumerate(routes):
            entries = [clean.pieces(i) if i < start[r] else (kv[r[:i + 1]],) for i in range(len(r))]
            out[r] = Prefilled(entries, last[r], logits[j])
        return out

    def _parent(self, prefix: LayerRoute, clean: CleanPrefix | None, embedded: Tensor | None,
                resid: dict[LayerRoute, Tensor]) -> Tensor:
        parent = prefix[:-1]
        if parent in resid:
            return resid[parent]
        if clean is None:
            return embedded  # depth 0 under a hooked embedding
        resid[parent] = clean.residual(len(parent))  # the clean full path's start, assembled once per depth
        return resid[parent]

    def _alone(self, prompt: TokenIds, route: LayerRoute) -> Prefilled:
        """The reference: every position of the route computed for this route alone, from the embedding."""
        resid = self._embed(prompt)
        kv = []
        for layer in route:
            resid, entry = self._block(layer, resid)
            kv.append((entry.row(0),))
        hidden = resid[0, -1]
        return Prefilled(kv, hidden, self.logits(hidden[None])[0])
