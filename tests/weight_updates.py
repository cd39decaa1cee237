"""Whole weight updates for tests that load a state dict into a server directly: the named
tensors as the ``BucketUpdate``s of one update (``servers.updates.bucket_updates``), sent in
order (an async actor would run concurrent calls interleaved)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from servers.updates import bucket_updates

__all__ = ["load_named", "load_named_sync"]


async def load_named(
    server: Any, named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = 256 << 20
) -> int:
    """Load ``named`` into ``server`` (a Ray actor handle); returns the tensors loaded."""
    loaded = 0
    for update in bucket_updates(named, bucket_bytes):
        loaded = await server.apply_weights.remote(update)
    return loaded


def load_named_sync(
    server: Any, named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = 256 << 20
) -> int:
    """``load_named`` outside an event loop."""
    import ray

    loaded = 0
    for update in bucket_updates(named, bucket_bytes):
        loaded = ray.get(server.apply_weights.remote(update))
    return loaded
