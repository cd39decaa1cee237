"""Which Ray nodes run what: a part may be held to the nodes that declare a custom resource.

On a cluster, nodes say what they are for with Ray custom resources (``ray start
--resources='{"rollout": 1}'``; a KubeRay worker group's ``rayStartParams``). A part started
with ``node_resource="rollout"`` asks for ``RESOURCE_UNIT`` of it, so it lands only on those
nodes and a thousand such parts fit on a node declaring 1. None: any node with the CPUs/GPUs
the part asks for, as Ray places it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RESOURCE_UNIT", "check_resource_name", "on_nodes_with"]

RESOURCE_UNIT = 0.001
"""What one part asks of its node resource: a node declaring 1 takes 1,000 parts."""

_RESERVED = {"CPU", "GPU", "memory", "object_store_memory"}


def check_resource_name(name: str | None, key: str) -> None:
    """A custom resource name a node can declare; raises ValueError naming ``key``."""
    if name is None:
        return
    if not name or name in _RESERVED or name.startswith("node:"):
        raise ValueError(
            f"{key}={name!r}: name a custom Ray resource your nodes declare "
            "(ray start --resources='{\"rollout\": 1}'), not CPU, GPU, memory or node:<ip>"
        )


def on_nodes_with(resource: str | None) -> dict[str, Any]:
    """Ray actor options that hold an actor to the nodes declaring ``resource`` ({} for
    None)."""
    return {} if resource is None else {"resources": {resource: RESOURCE_UNIT}}
