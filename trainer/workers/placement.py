"""Where the trainer ranks run: ``trainer.nnodes`` nodes x ``trainer.n_gpus_per_node`` ranks.

- One node, no ``trainer.node_resource`` (a laptop, one GPU box): on CPU the ranks run on the
  driver's node and claim no CPU in Ray's accounting (they share the cores with the rollout
  servers); on GPU each rank asks for one CPU and its GPU share, as before.
- Otherwise one placement group with a bundle per node (``STRICT_SPREAD``: each bundle on its
  own node), each bundle holding that node's ``n_gpus_per_node`` ranks: the same layout as
  verl's one placement group per node, with the nodes guaranteed distinct. A bundle asks for
  a GPU and a CPU per rank on GPU, and for ``trainer.node_resource`` (``servers.placement``)
  where set, so the ranks land only on the nodes declared for training. Bundles are taken
  in node-id order: rank r runs on node ``r // n_gpus_per_node`` of that order for the whole
  run, and on the same node again when a run resumes on the same nodes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from servers.placement import RESOURCE_UNIT

__all__ = ["RankPlacement", "place_ranks"]

logger = logging.getLogger(__name__)

CPU_BUNDLE = 0.01
"""CPUs a CPU rank's bundle asks for when nothing else marks its node (a bundle cannot be
empty); the rank itself claims them, so servers on the node keep the rest."""


@dataclass(slots=True)
class RankPlacement:
    options: list[dict[str, Any]]
    """Ray actor options of each rank, in rank order."""
    group: Any | None = None
    """The placement group holding the ranks' bundles (None: none was needed)."""

    def release(self) -> None:
        if self.group is not None:
            import ray

            ray.util.remove_placement_group(self.group)
            self.group = None


def place_ranks(
    world_size: int,
    nnodes: int,
    device: str,
    gpu_share: float,
    node_resource: str | None = None,
    timeout_s: float = 120.0,
) -> RankPlacement:
    """Reserve the ranks' places (see the module docstring); raises RuntimeError naming the
    keys to change when the cluster cannot hold them within ``timeout_s``."""
    import ray
    from ray.util.scheduling_strategies import (
        NodeAffinitySchedulingStrategy,
        PlacementGroupSchedulingStrategy,
    )

    if world_size % nnodes:
        raise ValueError(f"{world_size} trainer ranks do not split over trainer.nnodes={nnodes}")
    per_node = world_size // nnodes
    if nnodes == 1 and node_resource is None:
        if device == "cuda":
            return RankPlacement([{"num_cpus": 1, "num_gpus": gpu_share}] * world_size)
        here = ray.get_runtime_context().get_node_id()
        pin = NodeAffinitySchedulingStrategy(here, soft=False)
        return RankPlacement([{"num_cpus": 0, "scheduling_strategy": pin}] * world_size)
    rank: dict[str, float] = {"CPU": 1.0, "GPU": gpu_share} if device == "cuda" else {}
    if node_resource is not None:
        rank[node_resource] = RESOURCE_UNIT
    if not rank:
        rank = {"CPU": CPU_BUNDLE}
    bundle = {name: amount * per_node for name, amount in rank.items()}
    strategy = "STRICT_SPREAD" if nnodes > 1 else "STRICT_PACK"
    group = ray.util.placement_group([dict(bundle) for _ in range(nnodes)], strategy=strategy)
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        ray.util.remove_placement_group(group)
        raise RuntimeError(_unplaceable(nnodes, per_node, bundle, node_resource, timeout_s))
    nodes = ray.util.placement_group_table(group)["bundles_to_node_id"]
    order = sorted(range(nnodes), key=lambda b: nodes[b])
    options = []
    for r in range(world_size):
        strategy_r = PlacementGroupSchedulingStrategy(
            group, placement_group_bundle_index=order[r // per_node]
        )
        option: dict[str, Any] = {
            "num_cpus": rank.get("CPU", 0.0),
            "num_gpus": rank.get("GPU", 0.0),
            "scheduling_strategy": strategy_r,
        }
        if node_resource is not None:
            option["resources"] = {node_resource: RESOURCE_UNIT}
        options.append(option)
    logger.info(
        "trainer ranks: %d node(s) x %d, bundles on nodes %s",
        nnodes,
        per_node,
        ", ".join(nodes[b][:8] for b in order),
    )
    return RankPlacement(options, group)


def _unplaceable(
    nnodes: int, per_node: int, bundle: dict[str, float], resource: str | None, timeout_s: float
) -> str:
    import ray

    alive = [n for n in ray.nodes() if n.get("Alive")]
    fits = [n for n in alive if all(n["Resources"].get(k, 0) >= v for k, v in bundle.items())]
    marked = (
        f"; {sum(resource in n['Resources'] for n in alive)} declare {resource!r}"
        if resource
        else ""
    )
    return (
        f"the trainer's {nnodes} node(s) x {per_node} rank(s) could not be placed in "
        f"{timeout_s:.0f} s: each node needs {bundle} free, and {len(fits)} of the cluster's "
        f"{len(alive)} alive node(s) have that much in all{marked}. Add nodes (ray start "
        "--address=...), lower trainer.nnodes, or change trainer.node_resource"
    )
