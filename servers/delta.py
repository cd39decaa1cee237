"""Delta weight sync, the server's side: a server keeps the weights it last loaded (its *base*,
named by the sender) in shared-memory files, applies each later push's changes to them, loads
the result and answers with a checksum of what it now serves.

A ``DeltaUpdate`` (``servers.updates``) either establishes a base (``base=None``: every tensor
whole, like a ``BucketUpdate``) or changes one (``base``: the id the server must hold). Its
``DeltaEntry`` items say, per tensor, how:

- ``index`` None, ``add`` False: the whole tensor, replaced;
- ``index`` set: the values at those flat positions, replaced (exact; ``indices`` encoding);
- ``add`` True: differences added to the whole tensor (``bf16_diff``: the sender keeps what
  the server computes, so both sides stay equal bit for bit).

``weights_checksum`` is the one checksum both sides compute (Adler-32 over names and bytes in
name order): the sender over what it believes the server holds, the server over its base.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from servers.weights import (
    StagedBucket,
    iter_buckets,
    new_staging_file,
    stage_bucket,
)

__all__ = ["DeltaBase", "DeltaEntry", "apply_entry", "weights_checksum"]


@dataclass(frozen=True, slots=True)
class DeltaEntry:
    """One tensor's change (see the module docstring)."""

    name: str
    values: torch.Tensor
    index: torch.Tensor | None = None
    add: bool = False

    @property
    def nbytes(self) -> int:
        idx = 0 if self.index is None else self.index.numel() * self.index.element_size()
        return idx + self.values.numel() * self.values.element_size()


def apply_entry(target: torch.Tensor, entry: DeltaEntry) -> None:
    """Change ``target`` (the whole tensor, in place) as ``entry`` says."""
    flat = target.view(-1)
    values = entry.values.reshape(-1)
    if entry.add:
        flat.add_(values.to(flat.dtype))
    elif entry.index is None:
        flat.copy_(values)
    else:
        flat[entry.index.long()] = values


def weights_checksum(named: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Adler-32 over each tensor's name and raw bytes, in name order."""
    value = 1
    for name, tensor in sorted(named, key=lambda item: item[0]):
        value = zlib.adler32(name.encode(), value)
        raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
        value = zlib.adler32(raw.numpy(), value)
    return value


class DeltaBase:
    """The weights a server last loaded, in shared-memory files it owns, under the id the
    sender gave them. ``id`` is None while an update is half done or none was ever loaded:
    the sender then sends the next one whole."""

    def __init__(self) -> None:
        self.id: str | None = None
        self.buckets: list[StagedBucket] = []
        self._files: list[str] = []  # kept across updates: rewriting pages is faster
        self._views: dict[str, torch.Tensor] = {}
        self._target: str | None = None

    def begin(self, base: str | None, target: str) -> None:
        """Start an update to ``target``: whole (``base`` None) or against ``base``, which
        must be the one held (else ``ValueError``: the sender should send it whole)."""
        if base is not None and base != self.id:
            raise ValueError(
                f"delta weight update against base {base!r}, but this server holds "
                f"{self.id!r}: send the weights whole (DeltaUpdate with base=None)"
            )
        self.id, self._target = None, target
        if base is None:
            self.buckets, self._views = [], {}

    def stage(self, named: list[tuple[str, torch.Tensor]]) -> int:
        """Write whole tensors of a base being established; returns their bytes."""
        index = len(self.buckets)
        if index == len(self._files):
            self._files.append(new_staging_file())
        bucket = stage_bucket(named, self._files[index])
        self.buckets.append(bucket)
        return bucket.nbytes

    def apply(self, entries: list[DeltaEntry]) -> int:
        """Change the held base in place; returns the bytes the entries carried."""
        views = self._writable()
        for entry in entries:
            if entry.name not in views:
                raise ValueError(
                    f"delta weight update names {entry.name!r}, which the base does not hold"
                )
            apply_entry(views[entry.name], entry)
        return sum(e.nbytes for e in entries)

    def finish(self) -> None:
        self.id, self._target = self._target, None

    def wire(self) -> list[dict]:
        """The base's files as ``StagedUpdate`` buckets (what the engine loads)."""
        return [b.to_wire() for b in self.buckets]

    def checksum(self) -> int:
        return weights_checksum(iter_buckets(self.buckets))

    def close(self) -> None:
        self._views = {}
        for path in self._files:
            Path(path).unlink(missing_ok=True)
        self._files, self.buckets, self.id = [], [], None

    def _writable(self) -> dict[str, torch.Tensor]:
        """Writable views of every tensor of the base (its files mapped shared)."""
        if not self._views:
            for bucket in self.buckets:
                size = max((t.offset + t.nbytes for t in bucket.tensors), default=0)
                if size == 0:
                    continue
                raw = torch.from_file(bucket.path, shared=True, size=size, dtype=torch.uint8)
                for t in bucket.tensors:
                    dtype = getattr(torch, t.dtype)
                    view = raw[t.offset : t.offset + t.nbytes].view(dtype).view(t.shape)
                    self._views[t.name] = view
        return self._views
