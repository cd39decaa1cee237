"""The SFT step is one optimizer step on the token-mean NLL of the assistant tokens, whatever
the micro-batching (fixed sizes or packed by tokens)."""

from __future__ import annotations

import copy

import pytest
import torch

from trainer.config.actor import ModelConfig
from trainer.workers.batch import TrainBatch
from trainer.workers.fsdp import load_model
from trainer.workers.sft_step import sft_update


@pytest.fixture(scope="module")
def model(tiny_qwen3_path):
    return load_model(str(tiny_qwen3_path), ModelConfig(path=str(tiny_qwen3_path)), "cpu")


def make_batch(n: int = 6, p: int = 8, r: int = 16) -> TrainBatch:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 5000, (n, p + r), generator=g)
    attn = torch.ones(n, p + r, dtype=torch.long)
    for i in range(n):
        attn[i, : int(torch.randint(0, p - 1, (1,), generator=g))] = 0
        attn[i, p + int(torch.randint(3, r + 1, (1,), generator=g)) :] = 0
    mask = attn[:, p:].clone()
    mask[:, 1:3] = 0  # a tool response inside each response
    return TrainBatch(
        input_ids=ids,
        attention_mask=attn,
        position_ids=(attn.cumsum(1) - 1).clamp(min=0),
        response_mask=mask,
    )


def step(model, batch, **kwargs):
    model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)  # weight change = the gradient
    args = {"micro_batch_size": 1, "use_dynamic_bsz": False, "max_token_len": 4096}
    metrics = sft_update(model, optimizer, None, batch, **{**args, **kwargs}, grad_clip=1.0)
    return metrics, model.state_dict()


def test_loss_is_the_token_mean_nll_of_masked_tokens(model):
    batch = make_batch()
    metrics, _ = step(model, batch, micro_batch_size=6)
    with torch.no_grad():
        logits = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
        ).logits.float()
    p = batch.prompt_length
    log_probs = torch.log_softmax(logits[:, p - 1 : -1], -1)
    token_logp = log_probs.gather(-1, batch.responses.unsqueeze(-1)).squeeze(-1)
    mask = batch.response_mask.float()
    expected = float(-(token_logp * mask).sum() / mask.sum())
    assert metrics["train/loss"] == pytest.approx(expected, rel=1e-5)
    assert metrics["train/loss_tokens"] == float(mask.sum())
    assert metrics["train/lr"] == 1.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"micro_batch_size": 1},
        {"micro_batch_size": 4},
        {"use_dynamic_bsz": True, "max_token_len": 48},
    ],
)
def test_micro_batching_does_not_change_the_step(model, kwargs):
    whole, expected = step(model, make_batch(), micro_batch_size=6)
    split, state = step(model, make_batch(), **kwargs)
    assert split["train/loss"] == pytest.approx(whole["train/loss"], rel=1e-5)
    assert split["train/grad_norm"] == pytest.approx(whole["train/grad_norm"], rel=1e-4)
    worst = max((state[k] - v).abs().max().item() for k, v in expected.items())
    assert worst < 1e-6  # float32 sums in another order
    initial = model.state_dict()
    assert max((v - initial[k]).abs().max().item() for k, v in state.items()) > 1e-4
