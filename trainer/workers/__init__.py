"""FSDP2 trainer ranks (Ray actors) and the math they run."""

from trainer.workers.batch import TrainBatch, balanced_micro_batches, fixed_micro_batches
from trainer.workers.fsdp_worker import FSDPWorker, WorkerSpec
from trainer.workers.group import TrainerWorkerDiedError, WorkerGroup
from trainer.workers.policy_math import (
    LossSpec,
    forward_log_probs,
    log_probs_in_micro_batches,
    update_policy,
)

__all__ = [
    "FSDPWorker",
    "LossSpec",
    "TrainBatch",
    "TrainerWorkerDiedError",
    "WorkerGroup",
    "WorkerSpec",
    "balanced_micro_batches",
    "fixed_micro_batches",
    "forward_log_probs",
    "log_probs_in_micro_batches",
    "update_policy",
]
