"""Padding-free packing and chunked LM-head log-probs on the real model assets (fp32, CPU).

- log-probs and entropy: packed + chunked == padded + full logits within 1e-5;
- every parameter's gradient of the PPO loss (entropy and KL terms on), for every loss
  aggregation mode on tiny-qwen3 and the default one on smollm2: packed + chunked == padded +
  full logits, in float64 so that the check is of the math (within 1e-7) and not of fp32
  summation order;
- in fp32, each path's gradients against the float64 ones: on smollm2 the padded path itself
  is off by ~1e-4 of the gradient's norm (and by more than 1e-5 + 1e-5 |g| in hundreds of
  entries), so fp32 agreement within 1e-5 is below what either path reaches; the packed path
  must be as close to float64 as the padded one (within 2x, or 1e-4 of the norm).

The padded reference runs on its own copy of the model, untouched by the packed path."""

from __future__ import annotations

import copy

import pytest
import torch

from trainer.algos import LOSS_AGG_MODES, agg_denominator
from trainer.config.actor import ModelConfig
from trainer.workers import policy_math
from trainer.workers.batch import TrainBatch
from trainer.workers.fsdp import load_model
from trainer.workers.policy_math import LossSpec, forward_log_probs

pytestmark = pytest.mark.integration

P, R = 24, 40
CHUNK = 1 << 22  # gradient entries compared at a time
PROMPTS = [24, 9, 17, 5]
RESPONSES = [40, 12, 29, 3]


def _batch(vocab: int) -> TrainBatch:
    g = torch.Generator().manual_seed(0)
    n = len(PROMPTS)
    ids = torch.randint(0, vocab, (n, P + R), generator=g)
    attn = torch.zeros_like(ids)
    for i, (p, r) in enumerate(zip(PROMPTS, RESPONSES, strict=True)):
        attn[i, P - p : P + r] = 1
    response = attn[:, P:].clone()
    response[0, 10:22] = 0  # tool output inside a response
    response[2, 4:9] = 0
    mask = response.float()
    return TrainBatch(
        input_ids=ids,
        attention_mask=attn,
        position_ids=(attn.cumsum(1) - 1).clamp(min=0),
        response_mask=response,
        old_log_probs=-3.0 + 0.1 * torch.randn(n, R, generator=g) * mask,
        ref_log_probs=-3.0 + 0.1 * torch.randn(n, R, generator=g) * mask,
        advantages=torch.randn(n, 1, generator=g).expand(n, R) * mask,
    )


def _spec(mode: str, packed: bool, chunk: int) -> LossSpec:
    return LossSpec(
        clip_low=0.2, clip_high=0.28, clip_ratio_c=3.0, loss_agg_mode=mode,
        entropy_coeff=0.01, use_kl_loss=True, kl_loss_coef=0.1, kl_loss_type="low_var_kl",
        temperature=0.9, remove_padding=packed, chunk_size=chunk,
    )  # fmt: skip


def _grads(model: torch.nn.Module, mode: str, packed: bool, chunk: int) -> torch.Tensor:
    """All gradients of the PPO loss under ``mode``, flattened into one tensor (the model's
    own ``.grad`` freed again)."""
    batch = _batch(model.config.vocab_size)
    model.zero_grad(set_to_none=True)
    denominator = max(agg_denominator(batch.response_mask, mode, R), 1.0)
    spec = _spec(mode, packed, chunk)
    loss, _ = policy_math._micro_loss(model, batch.trimmed(), spec, denominator, 1.0)
    loss.backward()
    grads = [p.grad.flatten() for _, p in model.named_parameters() if p.grad is not None]
    assert grads
    flat = torch.cat(grads)
    del grads
    model.zero_grad(set_to_none=True)
    return flat


def _grads64(model: torch.nn.Module, mode: str, packed: bool, chunk: int) -> torch.Tensor:
    """``_grads`` of a float64 copy of ``model`` (dropped once its gradients are taken)."""
    copy64 = copy.deepcopy(model).double()
    flat = _grads(copy64, mode, packed, chunk)
    del copy64
    assert flat.dtype == torch.float64
    return flat


MODELS = ["tiny-qwen3", "smollm2-135m-instruct"]
# Every loss aggregation on the tiny model; the 135M model (where fp32 drifts from float64 the
# most) checks the default one: the aggregation math does not depend on the model's size.
MODES_OF = {"tiny-qwen3": LOSS_AGG_MODES, "smollm2-135m-instruct": ("token-mean",)}
CASES = [(name, mode) for name in MODELS for mode in MODES_OF[name]]


@pytest.fixture(scope="module", params=MODELS)
def models(request):
    """The padded and the packed copy of the model asset ``request.param``, and its name."""
    from trainer.models import prepare

    path = str(prepare(request.param))
    padded = load_model(path, ModelConfig(path=path), "cpu").train()
    packed = load_model(path, ModelConfig(path=path), "cpu").train()
    return padded, packed, request.param


@pytest.fixture(scope="module")
def compared(models) -> dict[str, dict]:
    """Per loss aggregation mode, the gradients of both paths in float64 and in fp32 (the
    trainer's dtype on CPU), compared as they come: the float64 paths' mismatch (None: equal
    within 1e-7) and each fp32 path's relative error against float64. One mode's gradients
    and one float64 model copy are held at a time (smollm2's are 135M numbers each)."""
    padded, packed, name = models
    out: dict[str, dict] = {}
    for mode in MODES_OF[name]:
        p64 = _grads64(padded, mode, False, chunk=0)
        k64 = _grads64(packed, mode, True, chunk=16)
        p32 = _grads(padded, mode, False, chunk=0)
        k32 = _grads(packed, mode, True, chunk=16)
        mismatch = None
        for part in range(0, p64.numel(), CHUNK):  # in slices: no whole-size temporaries
            try:
                got, want = k64[part : part + CHUNK], p64[part : part + CHUNK]
                torch.testing.assert_close(got, want, rtol=1e-7, atol=1e-7)
            except AssertionError as exc:
                mismatch = f"elements {part}..: {exc}"
                break
        norm = p64.norm()  # the truth: == the packed float64 gradients within 1e-7
        out[mode] = {
            "float64_mismatch": mismatch,
            "padded32_error": _distance(p32, p64) / float(norm),
            "packed32_error": _distance(k32, p64) / float(norm),
        }
    return out


def test_log_probs_and_entropy_match(models):
    padded, packed, _ = models
    batch = _batch(padded.config.vocab_size).trimmed()
    with torch.no_grad():
        ref, ref_ent = forward_log_probs(
            padded, batch, temperature=0.9, with_entropy=True, remove_padding=False, chunk_size=0
        )
        got, ent = forward_log_probs(
            packed, batch, temperature=0.9, with_entropy=True, remove_padding=True, chunk_size=16
        )
    assert packed.config._attn_implementation == "agentloop_packed"
    # the padded path runs transformers' SDPA under the guarded mask (guard_padded_attention)
    assert padded.config._attn_implementation == "agentloop_packed"
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, ref_ent, rtol=1e-5, atol=1e-5)


def _distance(got: torch.Tensor, truth: torch.Tensor) -> float:
    """||got - truth|| in float64, a slice at a time."""
    total = 0.0
    for part in range(0, truth.numel(), CHUNK):
        diff = got[part : part + CHUNK].double() - truth[part : part + CHUNK]
        total += float(diff.square().sum())
    return total**0.5


@pytest.mark.parametrize("models, mode", CASES, indirect=["models"])
def test_packed_gradients_match_padded_for_every_loss_aggregation(compared, mode):
    assert compared[mode]["float64_mismatch"] is None, compared[mode]["float64_mismatch"]


@pytest.mark.parametrize("models, mode", CASES, indirect=["models"])
def test_packed_fp32_gradients_are_as_close_to_float64_as_the_padded_ones(compared, mode):
    padded, packed = compared[mode]["padded32_error"], compared[mode]["packed32_error"]
    assert 0 < padded < 5e-4  # fp32 is not float64, and is close to it
    assert packed <= max(2 * padded, 1e-4), (packed, padded)
