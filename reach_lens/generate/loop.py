"""The batched decode loop: rows of any prompts and routes in one batch, slots refilled as rows end.

- Rows run in batches of ``batch_size`` slots over a right-aligned ``DecodeCache``. A batch runs one
  *schedule*: a common supersequence of its rows' routes (for non-decreasing routes, each layer as many
  times as the route using it most). A row's route is a subsequence of the schedule; a slot the row does not
  use is the identity for it, exactly. A slot that only some rows run (at most ``SUBSET_SHARE`` of the batch) is
  computed on those rows alone, on a copy of their keys and values (routes of the uniform law, ~58 layers drawn
  from 30, make schedules of ~270 slots of which each row runs a fifth); otherwise on the whole batch, the other
  rows' outputs discarded (``where(keep, block(x), x)``; the only way with ``subsets=False``, a reference). Each
  slot has its own KV entry, so a repeated layer keeps its own keys.
- A row that ends frees its slot; the next waiting row whose route fits the schedule is prefilled (with the
  next routes of its prompt, ``ROUTE_GROUP`` at a time: ``prefill.Prefiller``) and written into it. When no
  waiting row fits, the batch drains and the next one starts with a new schedule.
- Rows start longest prompt first (a prompt's rows together, its routes in order), so that a batch's prompts
  have similar lengths and little of its padded work is padding.
- Around every forward the rows' own positions are declared on the call's ``PositionSource``
  (``reach_lens.positions``), so positioned hooks act on each row's positions whatever its slot or the cache's
  padding.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor
from transformer_lens import HookedTransformer

from reach_lens.generate.attention import DecodeCache, Entry, block_device, rows_that_fit
from reach_lens.generate.choice import StopCheck, check_finite, choose
from reach_lens.generate.prefill import Pieces, Prefilled, Prefiller
from reach_lens.generate.types import Generation, Request, TokenIds
from reach_lens.positions import PositionSource
from reach_lens.routes import LayerRoute

FIT_WINDOW = 4  # waiting rows scanned for one that fits the schedule: FIT_WINDOW * batch_size
# a slot that at most this share of a batch's rows run is computed on those rows alone (on a copy of their keys and
# values), not on the whole batch with the others' outputs discarded
SUBSET_SHARE = 0.75
ROUTE_GROUP = 32  # routes of one prompt prefilled together: their keys and values live until their rows start
CPU = torch.device("cpu")  # bookkeeping (lengths, slots, keep masks, next tokens) lives on the host


def schedule(routes: Sequence[LayerRoute]) -> list[int]:
    """A common supersequence of ``routes``: for non-decreasing routes each layer as often as the route that runs
    it most, in layer order; otherwise a shortest common supersequence built pairwise."""
    if all(all(a <= b for a, b in itertools.pairwise(r)) for r in routes):
        most: dict[int, int] = {}
        for r in routes:
            for layer in set(r):
                most[layer] = max(most.get(layer, 0), r.count(layer))
        return [layer for layer in sorted(most) for _ in range(most[layer])]
    sched: list[int] = []
    for r in dict.fromkeys(routes):
        sched = _supersequence(sched, list(r))
    return sched


def embed(route: LayerRoute, sched: Sequence[int]) -> list[int] | None:
    """The schedule slots route positions use (greedy, leftmost), or None if ``route`` is not a subsequence."""
    used, j = [], 0
    for layer in route:
        while j < len(sched) and sched[j] != layer:
            j += 1
        if j == len(sched):
            return None
        used.append(j)
        j += 1
    return used


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
            out.append(a[i])
            i, j = i + 1, j + 1
        elif lcs[i + 1][j] >= lcs[i][j + 1]:
            out.append(a[i])
            i += 1
        else:
            out.append(b[j])
            j += 1
    return out + a[i:] + b[j:]


@dataclass
class _Row:
    request: Request
    route: LayerRoute
    stop: StopCheck
    generator: torch.Generator | None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    text: str | None = None
    hidden: Tensor | None = None


@dataclass
class _Batch:
    """The rows decoding together over one schedule: ``B`` slots (batch rows), ``S = len(schedule)``.

    - ``schedule``: ``[S]`` layers run in order; ``devices``: ``[S]`` where each runs.
    - ``cache``: ``B`` rows of keys and values, one entry per schedule position.
    - ``slots``: ``[B]`` the row id in each slot (-1: idle).
    - ``lengths``: ``[B]`` positions each slot holds (0: idle); ``next_tokens``: ``[B]`` the token each feeds next.
    - ``keep``: ``[B, S]`` the schedule positions each slot's route runs.
    - ``extra``: room a rebuilt cache keeps past its width (the longest continuation + 1).

    ``lengths``, ``keep`` and ``next_tokens`` live on the host (``CPU``).
    """

    schedule: list[int]
    devices: list[torch.device]
    cache: DecodeCache
    slots: list[int]
    lengths: Tensor
    keep: Tensor
    next_tokens: Tensor
    extra: int

    def live(self) -> list[int]:
        return [s for s, r in enumerate(self.slots) if r >= 0]

    def idle(self) -> list[int]:
        return [s for s, r in enumerate(self.slots) if r < 0]

    def write(self, slot: int, row_id: int, row: _Row, pre: Prefilled) -> None:
        """Put row ``row_id`` (``row``, prefilled as ``pre``) in ``slot``."""
        used = embed(row.route, self.schedule)
        sources: list[Pieces | None] = [None] * len(self.schedule)
        for i, j in enumerate(used):
            sources[j] = pre.kv[i]
        self.cache.write_row(slot, sources, len(row.request.prompt))
        self.keep[slot] = False
        self.keep[slot, used] = True
        self.slots[slot] = row_id
        self.lengths[slot] = len(row.request.prompt)
        self.next_tokens[slot] = row.tokens[-1]

    def regather(self, keep_idle: bool, width: int | None = None) -> None:
        """Rebuild the cache: drop idle slots unless ``keep_idle``, drop all-padding columns, make room."""
        kept = [s for s, r in enumerate(self.slots) if keep_idle or r >= 0]
        lengths = self.lengths[kept].clone()
        lengths[torch.tensor([self.slots[s] < 0 for s in kept], dtype=torch.bool, device=CPU)] = 0
        width = int(lengths.max()) if width is None else width
        self.cache = self.cache.gather(kept, lengths, width, width + self.extra)
        self.slots = [self.slots[s] for s in kept]
        self.lengths = lengths
        self.keep = self.keep[kept]
        self.next_tokens = self.next_tokens[kept]


class DecodeLoop:
    """Runs the rows of one engine call to completion (see the module docstring); ``run()`` returns them in
    request order."""

    def __init__(self, model: HookedTransformer, source: PositionSource, requests: Sequence[Request],
                 prefiller: Prefiller, decode: Callable[[list[int]], str] | None, eos: Sequence[int], batch_size: int,
                 subsets: bool = True):
        """``source``: the call's position source, on which each decode step declares its rows' positions;
        ``subsets=False`` runs every slot on the whole batch (a reference: see the module docstring)."""
        self.model, self.source, self.prefiller, self.batch_size = model, source, prefiller, batch_size
        self.subsets = subsets
        full = tuple(range(model.cfg.n_layers))
        self.rows = [
            _Row(r, r.route if r.route is not None else full,
                 StopCheck(tuple(eos) if r.stop_token_ids is None else r.stop_token_ids, r.stop_strings, decode,
                           r.max_new_tokens),
                 torch.Generator(device=CPU).manual_seed(int(r.seed)) if r.temperature > 0 else None)
            for r in requests
        ]
        prompt_order = {p: i for i, p in enumerate(dict.fromkeys(r.prompt for r in requests))}
        # longest prompt first: batches then hold prompts of similar lengths, so their right-padded prefills and
        # decode widths carry little padding, and a later row rarely needs a wider cache
        order = sorted(range(len(self.rows)), key=lambda i: (-len(self.rows[i].request.prompt),
                                                             prompt_order[self.rows[i].request.prompt],
                                                             self.rows[i].route, i))
        self.waiting = order  # row ids in start order
        self.need: dict[TokenIds, Counter[LayerRoute]] = {}  # rows still to start, per prompt and route
        for row in self.rows:
            self.need.setdefault(row.request.prompt, Counter())[row.route] += 1
        self.prefilled: dict[TokenIds, dict[LayerRoute, Prefilled]] = {}
        self.capacity_extra = max(r.max_new_tokens for r in requests) + 1

    # ---- starting rows ------------------------------------------------------------------------

    def _prefill(self, row_id: int) -> Prefilled:
        """The row's prefill: its route's, computed with the next routes of its prompt that rows will start
        (at most ``ROUTE_GROUP`` at a time, sharing their first layers), and dropped once no row needs it."""
        row = self.rows[row_id]
        prompt, route = row.request.prompt, row.route
        done = self.prefilled.setdefault(prompt, {})
        if route not in done:
            upcoming = [self.rows[r].route for r in self.waiting if self.rows[r].request.prompt == prompt]
            group = [r for r in dict.fromkeys([route, *upcoming]) if r not in done][:ROUTE_GROUP]
            if self.prefiller.batched_full_path(prompt, group):
                self._full_paths_ahead(prompt)
            else:
                done.update(self.prefiller(prompt, group))
        found = done[route]
        need = self.need[prompt]
        need[route] -= 1
        if need[route] == 0:
            del need[route], done[route]
        if not need:
            del self.need[prompt], self.prefilled[prompt]
        return found

    def _full_paths_ahead(self, prompt: TokenIds) -> None:
        """Prefill ``prompt`` with the next waiting prompts (up to ``batch_size`` in all) whose full paths are also
        batched (``Prefiller.batched_full_path``), together (``Prefiller.full_paths``)."""
        full = tuple(range(self.model.cfg.n_layers))
        prompts = [prompt]
        for row_id in self.waiting[: FIT_WINDOW * self.batch_size]:
            if len(prompts) == self.batch_size:
                break
            other = self.rows[row_id].request.prompt
            if other not in prompts and full not in self.prefilled.get(other, {}) and \
                    self.prefiller.batched_full_path(other, list(self.need[other])):
                prompts.append(other)
        for p, pre in zip(prompts, self.prefiller.full_paths(prompts)):
            self.prefilled.setdefault(p, {})[full] = pre

    def _start(self, row_id: int) -> Prefilled:
        """Prefill (shared) and choose the row's first token."""
        pre = self._prefill(row_id)
        check_finite(pre.logits[None], [row_id], self._describe)
        self._record(row_id, pre.logits[None], pre.hidden)
        return pre

    def _record(self, row_id: int, logits: Tensor, hidden: Tensor) -> None:
        row = self.rows[row_id]
        request = row.request
        tokens, logprobs, entropies = choose(logits, [request.temperature], [row.generator], [request.top_p])
        self._append(row_id, int(tokens[0]), float(logprobs[0]), float(entropies[0]), hidden)

    def _append(self, row_id: int, token: int, logprob: float, entropy: float, hidden: Tensor) -> None:
        row = self.rows[row_id]
        row.tokens.append(token)
        row.logprobs.append(logprob)
        row.entropies.append(entropy)
        row.finish_reason, row.text = row.stop(row.tokens)
        if row.finish_reason is not None and row.request.keep_hidden:
            row.hidden = hidden.detach().float().cpu().clone()

    def _describe(self, row_id: int) -> str:
        row = self.rows[row_id]
        route = "" if row.request.route is None else f", route {list(row.route)}"
        return (f"request {row_id} (prompt of {len(row.request.prompt)} tokens{route}) at generated token "
                f"{len(row.tokens)}")

    # ---- batches --------------------------------------------------------------------------------

    def _take_fitting(self, sched: Sequence[int]) -> int | None:
        """Pop the first waiting row (among the next few) whose route fits the batch's schedule ``sched``."""
        for k, row_id in enumerate(self.waiting[: FIT_WINDOW * self.batch_size]):
            if embed(self.rows[row_id].route, sched) is not None:
                return self.waiting.pop(k)
        return None

    def _new_batch(self) -> _Batch | None:
        """Start up to ``batch_size`` rows in a new batch; None when nothing is left to run."""
        started: list[tuple[int, Prefilled]] = []
        first = self.rows[self.waiting[0]] if self.waiting else None
        limit = self.batch_size if first is None else rows_that_fit(
            self.model, 2 * len(first.route), len(first.request.prompt) + self.capacity_extra, self.batch_size)
        while self.waiting and len(started) < limit:
            row_id = self.waiting.pop(0)
            pre = self._start(row_id)
            if self.rows[row_id].finish_reason is None:
                started.append((row_id, pre))
        if not started:
            return None
        sched = schedule([self.rows[r].route for r, _ in started])
        devices = [block_device(self.model, layer) for layer in sched]
        # room for the prompts of the rows that may fill this batch's slots soon, so that starting one of them
        # does not rebuild the cache (prompts of one task differ by a few tokens; a rebuild copies every slot)
        soon = [len(self.rows[r].request.prompt) for r in self.waiting[: FIT_WINDOW * self.batch_size]]
        width = max([len(self.rows[r].request.prompt) for r, _ in started] + soon)
        slots = [r for r, _ in started]
        cache = DecodeCache.allocate(self.model, devices, len(started), width + self.capacity_extra)
        lengths = torch.tensor([len(self.rows[r].request.prompt) for r in slots], dtype=torch.long, device=CPU)
        cache.set_width(width, lengths)
        batch = _Batch(sched, devices, cache, slots, lengths,
                       keep=torch.zeros(len(started), len(sched), dtype=torch.bool, device=CPU),
                       next_tokens=torch.tensor([self.rows[r].tokens[-1] for r in slots], dtype=torch.long, device=CPU),
                       extra=self.capacity_extra)
        for slot, (row_id, pre) in enumerate(started):
            batch.write(slot, row_id, self.rows[row_id], pre)
        return batch

    def _fill(self, batch: _Batch) -> None:
        """Start waiting rows that fit the schedule in idle slots."""
        while self.waiting:
            idle = batch.idle()
            if not idle:
                return
            row_id = self._take_fitting(batch.schedule)
            if row_id is None:
                return
            pre = self._start(row_id)
            if self.rows[row_id].finish_reason is not None:
                continue
            n = len(self.rows[row_id].request.prompt)
            if n > batch.cache.width:
                batch.regather(keep_idle=True, width=n)
                idle = batch.idle()
            batch.write(idle[0], row_id, self.rows[row_id], pre)

    # ---- the loop -------------------------------------------------------------------------------

    def run(self) -> list[Generation]:
        while (batch := self._new_batch()) is not None:
            while batch.live():
                if batch.cache.width + 1 > batch.cache.capacity:
                    batch.regather(keep_idle=bool(self.waiting))
                self._step(batch)
                n_idle = len(batch.idle())
                if n_idle and self.waiting:
                    self._fill(batch)
                    n_idle = len(batch.idle())
                if n_idle and 2 * n_idle >= len(batch.slots) and batch.live():
                    batch.regather(keep_idle=False)
        return [Generation(r.tokens, r.logprobs, r.entropies, r.finish_reason, r.text, r.request.route, r.hidden)
                for r in self.rows]

    def _run_rows(self, layer: int, entry: Entry, resid: Tensor, pos_embed: Tensor | None, mask: Tensor,
                  rows: Tensor, positions: Tensor, prompt_lengths: Tensor) -> Tensor:
        """Block ``layer`` on batch ``rows`` alone (the rows that run its slot, ``[n]`` on the host), on a copy of
        their keys and values in ``entry``; the other rows of ``resid`` (``[batch, 1, d_model]``) pass unchanged.
        Positioned hooks see the rows' own positions."""
        dev = resid.device
        if not len(rows):
            entry.length += 1  # the slot's column of this step exists for every row, and is read by none
            return resid
        index = rows.to(dev)
        sub = entry.rows(index)
        with self.source.declare(positions[rows].to(dev), prompt_lengths[rows].to(dev)):
            post = self.model.blocks[layer](resid[index], shortformer_pos_embed=None if pos_embed is None else
                                            pos_embed[index], past_kv_cache_entry=sub,
                                            attention_mask=mask.to(dev)[index])
        entry.take_step(sub, index)
        return resid.index_copy(0, index, post)

    def _step(self, batch: _Batch) -> None:
        model = self.model
        device = model.embed.W_E.device
        tokens = batch.next_tokens[:, None].to(device)
        live = batch.live()
        running = torch.tensor([r >= 0 for r in batch.slots], device=CPU)
        positions = torch.where(running, batch.lengths, -1)[:, None]
        prompt_lengths = torch.tensor([len(self.rows[r].request.prompt) if r >= 0 else 0 for r in batch.slots],
                                      device=CPU)
        uses = batch.keep & running[:, None]  # [B, S]: the live slots that run each schedule position
        counts = uses.sum(0).tolist()
        with self.source.declare(positions.to(device), prompt_lengths.to(device)):
            resid, _, shortformer, mask = model.input_to_embed(tokens, attention_mask=torch.ones_like(tokens),
                                                               past_kv_cache=batch.cache)
            for j, layer in enumerate(batch.schedule):
                dev, entry = batch.devices[j], batch.cache.entries[j]
                resid = resid.to(dev)
                pos_embed = None if shortformer is None else shortformer.to(dev)
                every = counts[j] == len(live)  # every live row runs the slot (idle rows' outputs are never read)
                if self.subsets and not every and counts[j] <= SUBSET_SHARE * len(batch.slots):
                    resid = self._run_rows(layer, entry, resid, pos_embed, mask, uses[:, j].nonzero()[:, 0],
                                           positions, prompt_lengths)
                    continue
                post = model.blocks[layer](resid, shortformer_pos_embed=pos_embed, past_kv_cache_entry=entry,
                                           attention_mask=mask.to(dev))
                resid = post if every else torch.where(batch.keep[:, j, None, None].to(dev), post, resid)
            hidden = resid[:, -1]
            logits = self.prefiller.logits(hidden)
        batch.lengths[live] += 1
        check_finite(logits[live], [batch.slots[s] for s in live], self._describe)
        rows = [batch.slots[s] for s in live]
        chosen, logprobs, entropies = choose(logits[live], [self.rows[r].request.temperature for r in rows],
                                             [self.rows[r].generator for r in rows],
                                             [self.rows[r].request.top_p for r in rows])
        for j, (slot, row_id) in enumerate(zip(live, rows)):
            self._append(row_id, int(chosen[j]), float(logprobs[j]), float(entropies[j]), hidden[slot])
            batch.next_tokens[slot] = int(chosen[j])
            if self.rows[row_id].finish_reason is not None:
                batch.slots[slot] = -1
                batch.lengths[slot] = 0
