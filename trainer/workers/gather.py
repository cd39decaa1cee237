"""State-dict entries out of the FSDP2 shards: one at a time (``gather_tensor``, the step
``full_tensors`` in ``trainer.workers.fsdp`` and the merged LoRA export take) or many small
ones in one collective (``gather_tensors``, the LoRA adapter's sync and export)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["gather_tensor", "gather_tensors"]


def gather_tensor(
    value: torch.Tensor, *, dtype: torch.dtype | None = None, device: str | None = "cpu"
) -> torch.Tensor:
    """The whole of ``value`` (a DTensor is all-gathered: collective, every rank must call it;
    a plain tensor is returned as it is), detached.

    A floating-point ``value`` is cast to ``dtype`` on the trainer's device *before* the
    all-gather, so a bf16 target moves half the bytes through the collective and any copy after
    it (None: its own dtype). ``device``: where the result ends up (``"cpu"``: a host copy;
    None: it stays on the trainer's device, for a device-to-device transfer)."""
    if dtype is not None and value.is_floating_point():
        value = value.to(dtype)  # a DTensor casts its local shard
    if hasattr(value, "full_tensor"):
        value = value.full_tensor()
    value = value.detach()
    return value if device is None else value.to(device)


def _row_sharded(value: torch.Tensor) -> bool:
    """A DTensor laid out as FSDP2 lays out parameters: rows split over a 1-D mesh in rank
    order (``Shard(0)``), the layout ``gather_tensors`` reassembles."""
    from torch.distributed.tensor import DTensor, Shard

    return (
        isinstance(value, DTensor)
        and value.device_mesh.ndim == 1
        and tuple(value.placements) == (Shard(0),)
        and value.dim() >= 1
    )


def gather_tensors(
    values: Sequence[torch.Tensor],
    *,
    dtype: torch.dtype | None = None,
    device: str | None = "cpu",
) -> list[torch.Tensor]:
    """``[gather_tensor(v) for v in values]`` with the row-sharded DTensors among them moved in
    one all-gather: each rank's shards, cast to ``dtype``, concatenated into one flat buffer
    (padded to the longest rank's), and cut back into tensors on every rank. Hundreds of
    small tensors (a LoRA adapter: two per adapted layer) otherwise cost one collective each.
    Floating-point ``values`` must share one dtype once cast (``dtype`` None: their own).

    Collective: every rank must call it with the same entries in the same order."""
    import torch.distributed as dist

    out: list[torch.Tensor | None] = [None] * len(values)
    rows = [i for i, v in enumerate(values) if _row_sharded(v) and v.is_floating_point()]
    meshes = {values[i].device_mesh for i in rows}  # type: ignore[attr-defined]
    kinds = {(values[i].dtype if dtype is None else dtype) for i in rows}
    if len(meshes) != 1 or len(kinds) != 1:
        rows = []  # nothing to coalesce: one collective per tensor
    coalesced = set(rows)
    for i, value in enumerate(values):
        if i not in coalesced:
            out[i] = gather_tensor(value, dtype=dtype, device=device)
    if rows:
        group = next(iter(meshes)).get_group()
        world = dist.get_world_size(group)
        local = [values[i].to_local().detach() for i in rows]  # type: ignore[attr-defined]
        flat = torch.cat([t.to(next(iter(kinds))).reshape(-1) for t in local])
        sizes = torch.tensor([t.numel() for t in local], dtype=torch.int64, device=flat.device)
        all_sizes = sizes.new_empty(world * len(rows))  # flat outputs: gloo takes no others
        dist.all_gather_into_tensor(all_sizes, sizes, group=group)
        all_sizes = all_sizes.view(world, len(rows))
        longest = int(all_sizes.sum(1).max())
        padded = flat.new_zeros(longest)
        padded[: flat.numel()] = flat
        gathered = flat.new_empty(world * longest)
        dist.all_gather_into_tensor(gathered, padded, group=group)
        gathered = gathered.view(world, longest)
        if device is not None:
            gathered = gathered.to(device)
        counts = all_sizes.tolist()
        pieces = [gathered[r, : sum(counts[r])].split(counts[r]) for r in range(world)]
        for j, i in enumerate(rows):
            tail = tuple(values[i].shape[1:])
            out[i] = torch.cat([pieces[r][j].view(-1, *tail) for r in range(world)])
    return out  # type: ignore[return-value]
