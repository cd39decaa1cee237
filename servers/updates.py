"""The weight updates a server accepts, as one small union (``AsyncServer.apply_weights``).

A sender asks a server what it accepts (``WeightSyncInfo.updates``, from the engine's
``weight_updates``) and sends only those kinds, so nothing probes a server for methods:

- ``BucketUpdate``: named tensors in buckets (Ray objects), the route every backend takes;
  the first bucket of an update has ``begin``, the last ``finish`` (which loads them all).
- ``StagedUpdate``: shared-memory files a sender on the server's node wrote itself (vLLM).
- ``AdapterUpdate``: a LoRA adapter, served as the next adapter version (vLLM with LoRA).
- ``TransferUpdate``: one step of vLLM's weight-transfer API (``weight_transfer=nccl|ipc``):
  the tensors travel GPU to GPU, sent by vLLM's trainer-side engine, never through here.
- ``DeltaUpdate``: delta weight sync (``servers.delta``): the whole weights once, then only
  what changed since the base the server holds; any server that loads staged files takes it.

Send one update to many servers through one Ray object (``ray.put(update)``): a top-level
object ref reaches each server as the update, serialized once.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch

from servers.delta import DeltaEntry
from servers.weights import bucketize

__all__ = [
    "AdapterUpdate",
    "BucketUpdate",
    "DeltaUpdate",
    "StagedUpdate",
    "TransferUpdate",
    "UPDATE_KINDS",
    "UpdateKind",
    "WeightUpdate",
    "bucket_updates",
]

UpdateKind = Literal["buckets", "staged", "adapter", "transfer", "delta"]
UPDATE_KINDS: tuple[UpdateKind, ...] = ("buckets", "staged", "adapter", "transfer", "delta")


@dataclass(frozen=True, slots=True)
class BucketUpdate:
    """One bucket of a full set of named tensors; the server stages it and loads every
    bucket of the update at ``finish``. ``apply_weights`` returns the bucket's bytes, or at
    ``finish`` the tensors loaded."""

    kind: ClassVar[UpdateKind] = "buckets"
    named: list[tuple[str, torch.Tensor]] = field(default_factory=list)
    begin: bool = False
    """The first bucket: drops whatever a half-done update left staged."""
    finish: bool = False
    """The last bucket: load every staged bucket into the engine, reset the prefix cache."""


@dataclass(frozen=True, slots=True)
class StagedUpdate:
    """Shared-memory buckets a sender on this node wrote (``StagedBucket.to_wire``); the
    server only loads them (``apply_weights`` returns the tensors loaded)."""

    kind: ClassVar[UpdateKind] = "staged"
    buckets: list[dict[str, Any]]
    writer_node: str | None = None
    """The Ray node the files were written on; a file from another node is refused (its
    ``/dev/shm`` is not this one's, even where a test cluster's nodes share a machine)."""


@dataclass(frozen=True, slots=True)
class AdapterUpdate:
    """A LoRA adapter's PEFT-named ``tensors`` and PEFT's ``adapter_config.json`` dict, served
    as the next adapter version (``apply_weights`` returns it)."""

    kind: ClassVar[UpdateKind] = "adapter"
    tensors: dict[str, torch.Tensor]
    config: dict[str, Any]


TransferStep = Literal["init", "start", "update", "finish", "shutdown"]


@dataclass(frozen=True, slots=True)
class TransferUpdate:
    """One step of vLLM's weight-transfer API, in its order: ``init`` (``info``: the engine's
    init info, once per group), ``start``, ``update`` (``info``: one chunk's names, dtypes,
    shapes; IPC handles for ``ipc``) as often as vLLM sends, ``finish``; ``shutdown`` drops a
    group an earlier sender left."""

    kind: ClassVar[UpdateKind] = "transfer"
    step: TransferStep
    info: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class DeltaUpdate:
    """One bucket of a delta weight sync to the base ``target``: whole tensors (``named``)
    establishing it when ``base`` is None, else ``entries`` changing the base ``base`` the
    server must hold. ``apply_weights`` returns the bucket's bytes, or at ``finish`` the
    ``weights_checksum`` of what the server now serves."""

    kind: ClassVar[UpdateKind] = "delta"
    target: str
    base: str | None = None
    named: list[tuple[str, torch.Tensor]] = field(default_factory=list)
    entries: list[DeltaEntry] = field(default_factory=list)
    begin: bool = False
    finish: bool = False


WeightUpdate = BucketUpdate | StagedUpdate | AdapterUpdate | TransferUpdate | DeltaUpdate


def bucket_updates(
    named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = 256 << 20
) -> Iterator[BucketUpdate]:
    """A full set of named tensors as the ``BucketUpdate``s of one update (at least one:
    the first begins it, the last finishes it)."""
    buckets = list(bucketize(named, bucket_bytes)) or [[]]
    for i, bucket in enumerate(buckets):
        yield BucketUpdate(bucket, begin=i == 0, finish=i == len(buckets) - 1)
