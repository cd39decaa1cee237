"""Weight buckets staged in shared memory between a server and its engine workers.

The sender (trainer -> server actor) streams named tensors in buckets of about
``bucket_bytes``. Each bucket is written as one flat file under ``/dev/shm`` (raw bytes, tensor
after tensor) plus a small metadata list; the engine worker memory-maps the files and hands
zero-copy tensor views to vLLM's in-place ``reload_weights``. One memcpy on each side, no
pickling of tensor data, and the same path on CPU and GPU (the worker copies to its device).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

__all__ = [
    "TensorMeta",
    "StagedBucket",
    "bucketize",
    "new_staging_file",
    "stage_bucket",
    "read_bucket",
    "iter_buckets",
    "shm_dir",
    "sweep_orphans",
]

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


def shm_dir() -> Path:
    """``/dev/shm`` where it exists (RAM-backed), else the temp dir."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


_PREFIX = "agentloop-weights-"


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


def sweep_orphans(folder: Path) -> int:
    """Unlink staging files whose owner process is gone; returns how many were removed."""
    removed = 0
    for path in folder.glob(f"{_PREFIX}*.bin"):
        owner = path.name.removeprefix(_PREFIX).split("-", 1)[0]
        if owner.isdigit() and not _alive(int(owner)):
            path.unlink(missing_ok=True)
            removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
