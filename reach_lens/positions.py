"""Each batch row's own token positions in the forward pass in progress, for position-aware hooks.

A generation engine batches rows of different lengths (right-aligned KV caches, slots refilled as rows end),
so the column of a token in the batch is not its position in its own sequence. Around every forward it
runs, the engine declares the rows' positions here:

    with row_positions(positions, prompt_lengths):    # [batch, pos] and [batch]
        model.blocks[l](resid, ...)

and positioned hooks (``Steer(positions=...)``, per-position ``Silence`` means) read them with
``current()``. Outside such a scope (a plain forward, TransformerLens's own ``generate``) ``current()`` is
None and hooks find positions from the forward itself (``hooks.PositionTracker``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Int
from torch import Tensor


@dataclass(frozen=True)
class RowPositions:
    """``positions[b, t]``: position of column t's token in row b's own sequence (0 = its first prompt token;
    -1 marks a column that holds no token of the row, e.g. an idle slot); ``prompt_lengths[b]``: tokens in
    row b's prompt, against which negative positions count (-1 = the last prompt token)."""

    positions: Int[Tensor, "batch pos"]
    prompt_lengths: Int[Tensor, " batch"]

    def check(self, act: Tensor, hook_name: str) -> None:
        if tuple(act.shape[:2]) != tuple(self.positions.shape):
            raise RuntimeError(f"{hook_name}: activation of shape {tuple(act.shape)} does not match the engine's "
                               f"row positions {tuple(self.positions.shape)} [batch, pos]")

    def at(self, targets: Sequence[int]) -> Bool[Tensor, "batch pos"]:
        """True where a column holds one of the absolute ``targets`` of its row (negative: from the prompt's end)."""
        wanted = torch.tensor(list(targets), dtype=torch.long, device=self.positions.device)
        lengths = self.prompt_lengths.to(self.positions.device)
        resolved = torch.where(wanted[None, :] < 0, lengths[:, None] + wanted[None, :], wanted[None, :])  # [batch, n]
        active = (self.positions >= 0).any(-1)  # idle slots hold no row
        before_start = (resolved < 0) & active[:, None]
        if bool(before_start.any()):
            row, col = before_start.nonzero()[0].tolist()
            raise ValueError(f"position {targets[col]} is before the start of a {int(lengths[row])}-position prompt "
                             f"(row {row})")
        hit = (self.positions[:, :, None] == resolved[:, None, :]).any(-1)
        return hit & (self.positions >= 0)


_CURRENT: ContextVar[RowPositions | None] = ContextVar("reach_lens_row_positions", default=None)


@contextmanager
def row_positions(positions: Int[Tensor, "batch pos"], prompt_lengths: Int[Tensor, " batch"]) -> Iterator[RowPositions]:
    """Declare the rows' positions for the hooks of the forward passes run inside."""
    rows = RowPositions(positions, prompt_lengths)
    token = _CURRENT.set(rows)
    try:
        yield rows
    finally:
        _CURRENT.reset(token)


def current() -> RowPositions | None:
    """The positions declared by the engine for the forward in progress, or None outside an engine."""
    return _CURRENT.get()
