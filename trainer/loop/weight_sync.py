"""``WeightSync``: after each update, the actor's weights go to every rollout server.

This is the driver's side: it calls ``push_weights`` on every trainer rank, and the
ranks (``trainer/workers/weight_send.py``) send the weights in the dtype the servers serve in,
each server by the route its node allows: a server on the node of every rank loads one
shared-memory file the ranks wrote their shards into; a server on another node gets
all-gathered buckets of ``bucket_bytes`` (Ray objects) from rank 0, which it stages and loads;
with servers started for vLLM's NCCL or CUDA IPC weight transfer, vLLM's trainer-side engine
sends them GPU to GPU. The route each server got is in the step's metrics
(``weight_sync/server_<i>/<route>`` = 1, ``weight_sync/servers_<route>``). With delta sync
(``trainer.weight_sync_delta``) the servers get only what changed since the weights they hold;
``weight_sync/whole_servers`` counts those that got them whole.

On GPU with colocated servers (``hybrid_engine``) the servers sleep during the update and are
woken before the push; on CPU sleep/wake are no-ops.
"""

from __future__ import annotations

import logging
import time
from typing import Any

__all__ = ["WeightSync", "delta_spec", "route_metrics"]

logger = logging.getLogger(__name__)


class WeightSync:
    def __init__(
        self,
        workers: Any,
        servers: list[Any],
        *,
        bucket_mb: int,
        colocated: bool,
        starts_ahead: bool = False,
        delta: Any = None,
    ):
        self.workers, self.servers = workers, servers
        self.bucket_bytes = bucket_mb << 20
        self.delta = delta
        """``trainer.workers.weight_delta.DeltaSpec``, or None: whole weights each push."""
        self.colocated = colocated
        self.version = 0
        self.starts_ahead = starts_ahead
        """The actor starts from weights the servers do not load themselves (a LoRA adapter
        on servers that take none): they get them before the first rollout (``push_start``)
        and after a restart, also at version 0."""

    def push_start(self) -> None:
        """Before the first rollout of a fresh run: the actor's starting weights to servers
        that do not start with them (``starts_ahead``); the version stays 0."""
        if self.starts_ahead:
            sent = self._send(self.servers)
            logger.info("starting weights: %.1f MB to the servers", sent["bytes"] / 1e6)

    def release_servers(self) -> None:
        """Colocated GPU: free the engines' memory for the update."""
        import ray

        if self.colocated:
            ray.get([s.sleep.remote() for s in self.servers])

    def push_to(self, servers: list[Any]) -> None:
        """Bring restarted ``servers`` (which load the model folder's weights) to the current
        version; nothing to do before the first update."""
        if self.version == 0 and not self.starts_ahead:
            return
        start = time.perf_counter()
        sent = self._send(servers)
        logger.warning(
            "weights v%d pushed to %d restarted server(s) (%s): %.1f MB in %.2f s",
            self.version,
            len(servers),
            ", ".join(sent["routes"]),
            sent["bytes"] / 1e6,
            time.perf_counter() - start,
        )

    def push(self) -> dict[str, float]:
        """Send the current actor weights to every server; returns timing metrics."""
        import ray

        start = time.perf_counter()
        if self.colocated:
            ray.get([s.wake_up.remote() for s in self.servers])
        sent = self._send(self.servers)
        seconds = time.perf_counter() - start
        self.version += 1
        logger.info(
            "weights v%d: %d tensors, %.1f MB to %d server(s) in %.2f s",
            self.version,
            sent["tensors"],
            sent["bytes"] / 1e6,
            len(self.servers),
            seconds,
        )
        out = {
            "timing_s/weight_sync": seconds,
            "weight_sync/mb": sent["bytes"] / 1e6,
            "weight_sync/version": float(self.version),
            **route_metrics(sent["routes"]),
        }
        if "whole_servers" in sent:
            out["weight_sync/whole_servers"] = sent["whole_servers"]
        return out

    def _send(self, servers: list[Any]) -> dict[str, Any]:
        return self.workers.push_weights(servers, self.bucket_bytes, None, self.delta)


def delta_spec(config: Any) -> Any:
    """``trainer.weight_sync_delta`` as the ranks take it (a ``DeltaSpec``); None when off."""
    from trainer.workers.weight_delta import DeltaSpec

    if not config.enable:
        return None
    return DeltaSpec(config.encoding, config.full_every, config.min_change, config.checksum)


def route_metrics(routes: list[str]) -> dict[str, float]:
    """Each server's route as ``weight_sync/server_<i>/<route>`` = 1 (its index in the rollout
    group) and the servers per route as ``weight_sync/servers_<route>``."""
    out = {f"weight_sync/server_{i}/{route}": 1.0 for i, route in enumerate(routes)}
    for route in routes:
        key = f"weight_sync/servers_{route}"
        out[key] = out.get(key, 0.0) + 1.0
    return out
