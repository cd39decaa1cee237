"""Weight buckets staged in shared memory for a server's engine workers.

A staged bucket is one flat file under ``/dev/shm`` (raw bytes, tensor after tensor) plus a
small metadata list; the engine worker memory-maps the files and hands zero-copy tensor views
to vLLM's in-place ``reload_weights`` (the same path on CPU and GPU: the worker copies to its
device). Two writers:

- a sender on the server's node writes the file itself (``plan_bucket`` gives the layout,
  ``reserve_staging_file`` the memory) and the server only loads it: trainer ranks write
  their shards in place, so nothing is gathered, pickled or copied twice;
- a remote sender streams named tensors in buckets of about ``bucket_bytes`` (Ray objects),
  which the server writes into its own staging files (``stage_bucket``).
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from servers.pids import pid_alive
from servers.scratch import SCRATCH_PREFIX

__all__ = [
    "TensorMeta",
    "StagedBucket",
    "WeightSyncInfo",
    "bucket_size",
    "bucketize",
    "new_staging_file",
    "plan_bucket",
    "reserve_staging_file",
    "stage_bucket",
    "read_bucket",
    "iter_buckets",
    "new_adapter_root",
    "shm_dir",
    "sweep_orphans",
]

ALIGN = 64
"""Byte alignment of each tensor in a planned bucket (any dtype can view it; cache lines)."""

_DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.float64,
        torch.int64,
        torch.int32,
        torch.int8,
        torch.uint8,
        torch.bool,
    )
}


@dataclass(frozen=True, slots=True)
class TensorMeta:
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class StagedBucket:
    path: str
    tensors: tuple[TensorMeta, ...]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def to_wire(self) -> dict:
        """Plain data for an RPC (vLLM's msgspec channel does not rebuild dataclasses)."""
        return {
            "path": self.path,
            "tensors": [[t.name, t.dtype, list(t.shape), t.offset, t.nbytes] for t in self.tensors],
        }

    @classmethod
    def from_wire(cls, wire: dict) -> StagedBucket:
        return cls(
            wire["path"],
            tuple(
                TensorMeta(name, dtype, tuple(shape), offset, nbytes)
                for name, dtype, shape, offset, nbytes in wire["tensors"]
            ),
        )


@dataclass(frozen=True, slots=True)
class WeightSyncInfo:
    """What a server tells a weight sender (``AsyncServer.weight_sync_info``)."""

    backend: str
    """``vllm`` or ``sglang``."""
    dtype: str | None
    """The dtype the engine serves in (``bfloat16``, ``float32``, ...); senders cast to it on
    their own device before any copy. None: unknown (send float32; the engine casts)."""
    loads_staged: bool
    """The engine loads staging files a sender on its node wrote (``StagedUpdate``)."""
    transfer: str = "host"
    """``host`` (staging files or Ray buckets), or vLLM's weight-transfer API (``nccl`` /
    ``ipc``; ``TransferUpdate`` steps)."""
    workers: int = 1
    """Engine worker processes (tensor-parallel ranks): an NCCL group gives each a rank."""
    node_id: str | None = None
    """The server's Ray node (None outside Ray)."""
    lora_rank: int = 0
    """The largest LoRA adapter rank the server loads (``AdapterUpdate``); 0: it takes no
    adapters, so a LoRA trainer sends the merged full weights instead."""
    updates: tuple[str, ...] = ("buckets",)
    """The kinds of weight update the server's engine takes (``servers.updates``:
    ``buckets``, ``staged``, ``adapter``, ``transfer``); ``AsyncServer.weight_sync_info``
    fills it from the engine's ``weight_updates``."""
    delta_base: str | None = None
    """Delta weight sync: the id of the weights the server last loaded by a ``DeltaUpdate``
    (what a delta must be against); None: none (a new or restarted server), send them whole."""


def shm_dir() -> Path:
    """``/dev/shm`` where it exists (RAM-backed), else the temp dir."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


_PREFIX = "agentloop-weights-"
_ADAPTER_PREFIX = "agentloop-lora-"


def new_staging_file(directory: Path | None = None) -> str:
    """Create an empty staging file in shared memory; the caller owns (and unlinks) it.

    The name carries the owner's pid so that files left by a killed server (SIGKILL skips
    its cleanup, and ``/dev/shm`` is RAM) are removed by the next server that stages.
    """
    folder = directory or shm_dir()
    sweep_orphans(folder)
    fd, path = tempfile.mkstemp(prefix=f"{_PREFIX}{os.getpid()}-", suffix=".bin", dir=folder)
    os.close(fd)
    return path


def new_adapter_root(directory: Path | None = None) -> Path:
    """Create an empty folder in shared memory for the LoRA adapters a server is sent; the
    caller owns (and removes) it. Named after the owner's pid, like the staging files, so that
    a killed server's folder is removed by the next sweep."""
    folder = directory or shm_dir()
    sweep_orphans(folder)
    return Path(tempfile.mkdtemp(prefix=f"{_ADAPTER_PREFIX}{os.getpid()}-", dir=folder))


def sweep_orphans(folder: Path) -> int:
    """Remove the staging files, adapter folders and engine scratch folders
    (``servers.scratch``) whose owner process is gone; returns how many were removed."""
    removed = 0
    for prefix, pattern in (
        (_PREFIX, f"{_PREFIX}*.bin"),
        (_ADAPTER_PREFIX, f"{_ADAPTER_PREFIX}*"),
        (SCRATCH_PREFIX, f"{SCRATCH_PREFIX}*"),
    ):
        for path in folder.glob(pattern):
            owner = path.name.removeprefix(prefix).split("-", 1)[0]
            if not owner.isdigit() or pid_alive(int(owner)):
                continue
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed += 1
    return removed


def plan_bucket(
    path: str, entries: Iterable[tuple[str, torch.dtype, tuple[int, ...]]]
) -> StagedBucket:
    """The layout of a bucket a sender writes itself into ``path``: each ``(name, dtype,
    shape)`` at an offset aligned to ``ALIGN`` bytes, in order; the file needs
    ``bucket_size(plan)`` bytes (``reserve_staging_file``)."""
    metas: list[TensorMeta] = []
    offset = 0
    for name, dtype, shape in entries:
        key = str(dtype).removeprefix("torch.")
        if key not in _DTYPES:
            raise ValueError(f"weight {name!r} has unsupported dtype {dtype}")
        nbytes = _DTYPES[key].itemsize
        for dim in shape:
            nbytes *= int(dim)
        offset = -(-offset // ALIGN) * ALIGN
        metas.append(TensorMeta(name, key, tuple(int(d) for d in shape), offset, nbytes))
        offset += nbytes
    return StagedBucket(path, tuple(metas))


def bucket_size(bucket: StagedBucket) -> int:
    """Bytes the file of a planned bucket spans (the end of its last tensor)."""
    return max((t.offset + t.nbytes for t in bucket.tensors), default=0)


def reserve_staging_file(path: str, nbytes: int) -> None:
    """Give the staging file ``path`` ``nbytes`` of memory now, so that a ``/dev/shm`` too
    small fails here with a message instead of killing the writer (SIGBUS) mid-copy."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if os.fstat(fd).st_size > nbytes:
            os.ftruncate(fd, nbytes)
        os.posix_fallocate(fd, 0, max(nbytes, 1))
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        free = os.statvfs(os.path.dirname(path))
        raise OSError(
            errno.ENOSPC,
            f"{os.path.dirname(path)} has {free.f_bavail * free.f_frsize / 2**30:.1f} GiB free, "
            f"the weights need {nbytes / 2**30:.1f} GiB: give it more (docker run "
            "--shm-size=...) or free it",
        ) from None
    finally:
        os.close(fd)


def stage_bucket(named: Iterable[tuple[str, torch.Tensor]], path: str) -> StagedBucket:
    """Write tensors (any device) into the staging file ``path`` and describe them.

    The file is overwritten in place, not truncated: re-staging into a file that already
    holds a bucket reuses its memory pages, several times faster on tmpfs than allocating.
    """
    metas: list[TensorMeta] = []
    offset = 0
    with open(os.open(path, os.O_RDWR | os.O_CREAT, 0o600), "r+b") as fh:
        for name, tensor in named:
            dtype = str(tensor.dtype).removeprefix("torch.")
            if dtype not in _DTYPES:
                raise ValueError(f"weight {name!r} has unsupported dtype {tensor.dtype}")
            flat = tensor.detach().to("cpu").contiguous().view(-1).view(torch.uint8)
            fh.write(memoryview(flat.numpy()))
            metas.append(TensorMeta(name, dtype, tuple(tensor.shape), offset, flat.numel()))
            offset += flat.numel()
    return StagedBucket(path, tuple(metas))


def read_bucket(bucket: StagedBucket) -> Iterator[tuple[str, torch.Tensor]]:
    """Zero-copy views of a staged bucket's tensors (valid while the file is mapped)."""
    if bucket.nbytes == 0:
        return
    data = np.memmap(bucket.path, dtype=np.uint8, mode="c")  # copy-on-write, never written
    raw = torch.from_numpy(data)  # vLLM copies these views into its parameters
    for t in bucket.tensors:
        view = raw[t.offset : t.offset + t.nbytes].view(_DTYPES[t.dtype]).view(t.shape)
        yield t.name, view


def iter_buckets(buckets: Iterable[StagedBucket]) -> Iterator[tuple[str, torch.Tensor]]:
    for bucket in buckets:
        yield from read_bucket(bucket)


def bucketize(
    named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group named tensors into lists of about ``bucket_bytes`` (a larger tensor goes alone)."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket
