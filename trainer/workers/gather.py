"""One state-dict entry out of the FSDP2 shards: the step ``full_tensors``
(``trainer.workers.fsdp``) and the LoRA exports (``trainer.workers.lora``) share."""

from __future__ import annotations

import torch

__all__ = ["gather_tensor"]


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
