"""Delta weight sync, the trainer's side (``trainer.weight_sync_delta``): rank 0 remembers
what the servers hold (``DeltaSender.shadow``, the weights in the serving dtype, under an id)
and sends each server either the weights whole or only what changed since that id
(``servers.delta`` is the server's side).

A server gets the weights whole when it holds no base or another one (new, restarted, or
loaded by another route since); every server does on the first push and then every
``full_every``-th push (``full_every=10``: one whole, nine deltas). Otherwise
each tensor goes as one ``DeltaEntry`` of the chosen encoding, or not at all if it is
unchanged:

- ``indices`` (exact): the flat positions whose bits changed and their new values, or the
  whole tensor where that would be smaller. In bf16, a step at RL learning rates changes few
  elements' bits; in float32 it changes nearly all of them.
- ``bf16_diff``: float32 tensors as bf16 differences, added on the server (half the bytes);
  the shadow keeps what the server computes, so the rounding is carried into the next push
  rather than lost, and the periodic whole push clears it.

``min_change`` skips a tensor whose relative change (L2) is at most that since what the
servers hold; it is sent once its accumulated change passes. A push that also sends any
server the weights whole is exact for all (indices, nothing skipped), so every server ends
on the same weights. After each push rank 0 compares the checksum each server returns with
its own (``servers.delta.weights_checksum``): a mismatch is an error naming the server.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Literal

import torch

from servers.delta import DeltaEntry, apply_entry, weights_checksum

__all__ = ["DeltaEncoding", "DeltaSender", "DeltaSpec", "changed_positions"]

DeltaEncoding = Literal["indices", "bf16_diff"]

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass(frozen=True, slots=True)
class DeltaSpec:
    """``trainer.weight_sync_delta`` as the trainer ranks take it."""

    encoding: DeltaEncoding = "indices"
    full_every: int = 10
    min_change: float = 0.0
    checksum: bool = True


def changed_positions(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """Flat positions where ``new``'s bits differ from ``old``'s (so -0.0 and NaN count)."""
    bits = _BITS[new.element_size()]
    a = old.reshape(-1).view(bits) if old.dtype != torch.bool else old.reshape(-1)
    b = new.reshape(-1).view(bits) if new.dtype != torch.bool else new.reshape(-1)
    return (a != b).nonzero().squeeze(1)


class DeltaSender:
    """Rank 0's record of the weights the servers hold, and the encoder of each push."""

    def __init__(self, spec: DeltaSpec) -> None:
        self.spec = spec
        self.shadow: dict[str, torch.Tensor] = {}
        self.id: str | None = None
        self._session = uuid.uuid4().hex[:8]
        self._pushes = 0  # pushes since the last one that sent every server the weights whole
        self._count = 0
        self._exact = True

    def begin(self, bases: list[str | None]) -> tuple[list[bool], str | None, str]:
        """A push to servers holding ``bases``: which get the weights whole, the base the
        others' deltas are against, and the id the push establishes."""
        periodic = self.spec.full_every > 0 and self._pushes + 1 >= self.spec.full_every
        whole = [periodic or self.id is None or b != self.id for b in bases]
        self._pushes = 0 if all(whole) else self._pushes + 1
        self._exact = any(whole)
        self._count += 1
        return whole, self.id, f"{self._session}-{self._count}"

    def encode(self, name: str, new: torch.Tensor) -> DeltaEntry | None:
        """The entry that brings a server from the shadow to ``new`` (None: send nothing),
        and the shadow updated to what that server will hold (a copy: with one rank, or an
        entry that is not sharded, ``new`` is the live parameter, which the optimizer moves)."""
        old = self.shadow.get(name)
        if old is None or old.shape != new.shape or old.dtype != new.dtype:
            self.keep(name, new)
            return DeltaEntry(name, new)
        exact = self._exact
        if not exact and self.spec.min_change > 0 and new.is_floating_point():
            change = (new.float() - old.float()).norm() / old.float().norm().clamp_min(1e-12)
            if change.item() <= self.spec.min_change:
                return None
        if not exact and self.spec.encoding == "bf16_diff" and new.dtype == torch.float32:
            diff = (new - old).to(torch.bfloat16)
            if not diff.any():
                return None
            entry = DeltaEntry(name, diff, add=True)
            apply_entry(old, entry)  # the shadow: what the server computes
            return entry
        where = changed_positions(old, new)
        if where.numel() == 0:
            return None
        index = where.to(torch.int32 if new.numel() < 2**31 else torch.int64)
        sparse = where.numel() * (index.element_size() + new.element_size())
        if sparse >= new.numel() * new.element_size():
            old.copy_(new)
            return DeltaEntry(name, new)
        values = new.reshape(-1)[where]
        old.view(-1)[where] = values
        return DeltaEntry(name, values, index=index)

    def keep(self, name: str, new: torch.Tensor) -> None:
        """The servers get ``new`` whole: the shadow takes a copy."""
        old = self.shadow.get(name)
        if old is not None and old.shape == new.shape and old.dtype == new.dtype:
            old.copy_(new)
        else:
            self.shadow[name] = new.detach().clone()

    def finish(self, target: str) -> int | None:
        """The push is done: the servers hold ``target``; returns the shadow's checksum
        (None when ``checksum`` is off)."""
        self.id = target
        return weights_checksum(self.shadow.items()) if self.spec.checksum else None
