"""A real multi-node Ray cluster on one machine for tests: Ray's own ``cluster_utils.Cluster``
starts a head and worker nodes, each a raylet with its own resources, so placement, node ids and
node loss are Ray's real ones. The nodes share this machine's IP and ``/dev/shm``: anything that
must differ per node (a weight route) is decided by node id, which is what the tests assert.

The head declares no CPU (the driver only). Nodes are marked with custom resources, as a real
cluster's are (``ray start --resources=...``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.ray_local import REPO, stop_local_ray

__all__ = ["cluster_env", "node_id", "multinode_cluster"]


def cluster_env() -> dict[str, str]:
    """The environment every node's workers need (a real cluster's nodes get it from their
    image or ``ray start`` shell): the repository on the path, a small CPU KV cache."""
    return {
        "PYTHONPATH": str(REPO),
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
    }


@contextmanager
def multinode_cluster(nodes: dict[str, dict[str, Any]]) -> Iterator[tuple[Any, dict[str, Any]]]:
    """A head (0 CPUs) and one worker node per entry of ``nodes`` (name -> ``add_node``
    keywords); yields the cluster and the nodes by name. The shared local Ray is stopped
    first; the cluster is shut down (and Ray's address file removed) at the end."""
    from ray.cluster_utils import Cluster

    stop_local_ray()
    saved = {k: os.environ.get(k) for k in cluster_env()}
    os.environ.update(cluster_env())  # the raylets, and so every worker, inherit it
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        added = {name: cluster.add_node(**args) for name, args in nodes.items()}
        cluster.wait_for_nodes()
        yield cluster, added
    finally:
        cluster.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def node_id(node: Any) -> str:
    """The Ray node id of a ``cluster_utils`` node."""
    return node.node_id
