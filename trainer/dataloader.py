"""``PromptSampler``: batches of dataset rows, reshuffled every epoch from a seed, with a
state (epoch, batches taken) that a checkpoint stores so a resumed run continues with the
batch it would have drawn next: no repeated and no skipped prompts."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["PromptSampler"]


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
        self.position = 0  # batches taken in this epoch

    def __len__(self) -> int:
        """Full batches per epoch (the remainder of an epoch is dropped)."""
        return len(self.rows) // self.batch_size

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.rows)))
        gen = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(len(self.rows), generator=gen).tolist()

    def next_batch(self) -> list[dict[str, Any]]:
        if self.position >= len(self):
            self.epoch += 1
            self.position = 0
        start = self.position * self.batch_size
        index = self._order()[start : start + self.batch_size]
        self.position += 1
        return [self.rows[i] for i in index]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
