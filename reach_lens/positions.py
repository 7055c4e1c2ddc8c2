"""Each batch row's own token positions in a forward of the generation engine, for positioned hooks.

A generation engine batches rows of different lengths (right-aligned KV caches, slots refilled as rows end),
so the column of a token in the batch is not its position in its own sequence. The engine makes one
``PositionSource`` per call, builds the call's hooks with it, and declares the rows' positions on it around
every forward it runs:

    source = PositionSource()
    hooks = hooks_for(interventions, model, source)      # positioned hooks keep a reference to the source
    with model.hooks(fwd_hooks=hooks), source.declare(positions, prompt_lengths):   # [batch, pos], [batch]
        model.blocks[l](resid, ...)

A positioned hook built with a source reads the declared positions from it (``PositionSource.rows``); one
built without a source (a plain forward, TransformerLens's own ``generate``) finds positions from the forward
itself (``hooks.PositionTracker``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
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


class PositionSource:
    """The rows' positions of the forward in progress, declared by the engine that owns this source and read by
    the hooks built with it (module docstring)."""

    def __init__(self):
        self._declared: RowPositions | None = None

    @contextmanager
    def declare(self, positions: Int[Tensor, "batch pos"],
                prompt_lengths: Int[Tensor, " batch"]) -> Iterator[RowPositions]:
        """Declare the rows' positions for the forwards run inside (an inner declaration holds until it ends)."""
        outer, self._declared = self._declared, RowPositions(positions, prompt_lengths)
        try:
            yield self._declared
        finally:
            self._declared = outer

    def rows(self, act: Tensor, hook_name: str) -> RowPositions:
        """The declared positions, for an activation ``act`` of shape ``[batch, pos, ...]`` at ``hook_name``;
        RuntimeError when none are declared or their shape differs."""
        rows = self._declared
        if rows is None:
            raise RuntimeError(f"{hook_name}: no row positions declared; a hook built with a PositionSource runs "
                               "only in forwards of the engine that declares them (build it without one elsewhere)")
        if tuple(act.shape[:2]) != tuple(rows.positions.shape):
            raise RuntimeError(f"{hook_name}: activation of shape {tuple(act.shape)} does not match the engine's "
                               f"row positions {tuple(rows.positions.shape)} [batch, pos]")
        return rows
