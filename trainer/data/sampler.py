"""``PromptSampler``: dataset rows, reshuffled every epoch from a seed, taken a batch at a
time (sync training) or a row at a time (async training), with a state a checkpoint stores
so that a resumed run continues with the row it would have drawn next: no repeated and no
skipped prompts.

Each row drawn has a key ``(epoch, position in the epoch)``. Async training keeps prompts in
flight across a checkpoint; it stores their keys with ``requeue`` so that a resumed run rolls
them out again first (``next_row`` hands requeued keys out before new ones).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["PromptSampler"]

RowKey = tuple[int, int]
"""(epoch, position of the row in that epoch's order)"""


class PromptSampler:
    def __init__(
        self, rows: list[dict[str, Any]], batch_size: int, *, shuffle: bool = True, seed: int = 0
    ) -> None:
        if len(rows) < batch_size:
            raise ValueError(
                f"{len(rows)} training rows are fewer than data.train_batch_size={batch_size}: "
                "lower data.train_batch_size or add rows"
            )
        self.rows, self.batch_size, self.shuffle, self.seed = rows, batch_size, shuffle, seed
        self.epoch = 0
        self.offset = 0  # rows taken in this epoch
        self.requeued: list[RowKey] = []
        self._orders: dict[int, list[int]] = {}

    def __len__(self) -> int:
        """Full batches per epoch (the remainder of an epoch is dropped)."""
        return len(self.rows) // self.batch_size

    @property
    def position(self) -> int:
        """Whole batches taken in this epoch."""
        return self.offset // self.batch_size

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            if not self.shuffle:
                order = list(range(len(self.rows)))
            else:
                gen = torch.Generator().manual_seed(self.seed + epoch)
                order = torch.randperm(len(self.rows), generator=gen).tolist()
            self._orders = {epoch: order}  # one epoch's order is enough to keep
        return self._orders[epoch]

    def row(self, key: RowKey) -> dict[str, Any]:
        epoch, position = key
        return self.rows[self._order(epoch)[position]]

    def next_row(self) -> tuple[RowKey, dict[str, Any]]:
        """The next row and its key: a requeued one first, else the next of the epoch."""
        if self.requeued:
            key = self.requeued.pop(0)
            return key, self.row(key)
        if self.offset >= len(self) * self.batch_size:
            self.epoch += 1
            self.offset = 0
        key = (self.epoch, self.offset)
        self.offset += 1
        return key, self.row(key)

    def next_batch(self) -> list[dict[str, Any]]:
        return [self.next_row()[1] for _ in range(self.batch_size)]

    def after_step(self, step: int, rollout: Any, scores: torch.Tensor) -> None:
        """Called after every training step with its samples and scores (a ``data.sampler``
        curriculum updates here; this seeded shuffle does not change)."""

    def requeue(self, keys: list[RowKey]) -> None:
        """Hand these rows out again, first, in this order."""
        self.requeued = [tuple(k) for k in keys] + self.requeued  # type: ignore[misc]

    def state_dict(self, in_flight: list[RowKey] | None = None) -> dict[str, Any]:
        """``in_flight``: keys drawn but not trained yet; a resumed run draws them first."""
        requeued = [list(k) for k in (in_flight or [])] + [list(k) for k in self.requeued]
        return {
            "epoch": self.epoch,
            "position": self.position,
            "offset": self.offset,
            "requeued": requeued,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self.offset = int(state.get("offset", int(state["position"]) * self.batch_size))
        self.requeued = [(int(e), int(i)) for e, i in state.get("requeued", [])]
