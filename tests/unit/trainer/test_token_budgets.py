"""Token budgets through the trainer rank's own calls (``FSDPWorker`` on one process, no
process group, the tiny random Qwen3): with ``use_remove_padding`` (the default) a micro-batch's
budget counts its real tokens, otherwise rows x its longest row; the old-log-prob forward takes
``log_prob_max_token_len_per_gpu``, the reference forward ``ref.log_prob_max_token_len_per_gpu``
and the update ``ppo_max_token_len_per_gpu``. Counted by the forwards that really run."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.unit.trainer.tiny_model import tiny_qwen3
from trainer.config.actor import ActorConfig, ModelConfig, RefConfig
from trainer.workers import policy_math
from trainer.workers.batch import TrainBatch
from trainer.workers.fsdp_worker import FSDPWorker, WorkerSpec

P, R = 4, 36  # every sample: a 4-token prompt, then its response
LENGTHS = [40, 6, 6, 6, 6]  # real tokens per sample: 64 in all, 40 in the longest


def _batch() -> TrainBatch:
    g = torch.Generator().manual_seed(0)
    n = len(LENGTHS)
    attn = torch.zeros(n, P + R, dtype=torch.long)
    for i, length in enumerate(LENGTHS):
        attn[i, :length] = 1
    response = attn[:, P:].clone()
    mask = response.float()
    return TrainBatch(
        input_ids=torch.randint(1, 256, (n, P + R), generator=g) * attn,
        attention_mask=attn,
        position_ids=(attn.cumsum(1) - 1).clamp(min=0),
        response_mask=response,
        old_log_probs=-3.0 * mask,
        ref_log_probs=-3.0 * mask,
        advantages=torch.tensor([1.0, -1.0, 0.5, -0.5, 0.2]).unsqueeze(1) * mask,
    )


def _worker(packed: bool) -> FSDPWorker:
    actor = ActorConfig(
        use_dynamic_bsz=True,
        ppo_max_token_len_per_gpu=64,  # the update: all five samples fit when packed
        log_prob_max_token_len_per_gpu=63,  # old log-probs: one token short of all five
        use_kl_loss=True,
    )
    spec = WorkerSpec(
        model_path="unused",
        model=ModelConfig(path="unused", use_remove_padding=packed),
        actor=actor,
        ref=RefConfig(log_prob_max_token_len_per_gpu=40),  # the longest sample alone
        need_ref=True,
        device="cpu",
    )
    worker = FSDPWorker(spec, rank=0, world_size=1, master="unused")
    worker.model = tiny_qwen3()
    worker.ref_model = copy.deepcopy(worker.model)
    worker.optimizer = torch.optim.SGD(worker.model.parameters(), lr=0.1)
    worker.scheduler = torch.optim.lr_scheduler.LambdaLR(worker.optimizer, lambda _: 1.0)
    return worker


@pytest.fixture
def forwards(monkeypatch) -> list[tuple[list[int], bool]]:
    """(real tokens of each sample, packed) of every model forward that runs."""
    seen: list[tuple[list[int], bool]] = []
    real = policy_math.forward_log_probs

    def counted(model, mb, **kwargs):
        seen.append((mb.attention_mask.sum(-1).tolist(), kwargs["remove_padding"]))
        return real(model, mb, **kwargs)

    monkeypatch.setattr(policy_math, "forward_log_probs", counted)
    return seen


def test_use_remove_padding_is_on_by_default():
    assert ModelConfig(path="m").use_remove_padding is True


@pytest.mark.parametrize("packed", [True, False])
def test_each_forward_fits_its_budget_in_the_tokens_it_counts(forwards, packed):
    worker = _worker(packed)
    batch = _batch()

    def counts() -> list[int]:
        # packed: the real tokens; padded: rows x the longest row of the micro-batch
        out = [sum(t) if p else len(t) * max(t) for t, p in forwards]
        assert all(p == packed for _, p in forwards)
        forwards.clear()
        return out

    worker.compute_log_prob(batch)
    old = counts()
    worker.compute_ref_log_prob(batch)
    ref = counts()
    worker.update_actor(batch, samples_per_mini_batch=len(LENGTHS), seed=0)
    update = counts()
    assert all(n <= 63 for n in old) and all(n <= 40 for n in ref)
    assert all(n <= 64 for n in update)
    if packed:  # real tokens: 64 = 40 + 4 x 6
        assert (len(old), len(ref), len(update)) == (2, 2, 1)
    else:  # the four short rows pad to 6 each (24); the long one goes alone
        assert (len(old), len(ref), len(update)) == (2, 2, 2)
