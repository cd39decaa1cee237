"""``ChunkedLogProbs`` / ``LogProbHead``: the chunked LM-head log-probs and entropy equal the
full-logits ones, forward and backward (gradcheck in float64; 1e-5 in float32, with a
temperature), keep no [tokens, vocab] tensor for backward, and leave the head an
``nn.Linear`` with the same parameters when no request is set."""

from __future__ import annotations

import pytest
import torch

from trainer.algos import entropy_from_logits
from trainer.workers.log_prob_head import (
    ChunkedLogProbs,
    LogProbHead,
    LogProbRequest,
    install_log_prob_head,
)

K, D, V = 37, 16, 101


def _inputs(dtype: torch.dtype, seed: int = 0, k: int = K, d: int = D, v: int = V):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(k, d, generator=g, dtype=dtype).requires_grad_()
    weight = (0.3 * torch.randn(v, d, generator=g, dtype=dtype)).requires_grad_()
    tokens = torch.randint(0, v, (k,), generator=g)
    return hidden, weight, tokens


def _full(hidden, weight, tokens, temperature):
    logits = (hidden @ weight.t()).float() / temperature
    lp = logits.gather(-1, tokens[:, None]).squeeze(-1) - torch.logsumexp(logits, -1)
    return torch.stack([lp, entropy_from_logits(logits)], -1)


@pytest.mark.parametrize("chunk", [1, 3, 4096])
def test_gradcheck_float64(chunk):
    hidden, weight, tokens = _inputs(torch.float64, k=7, d=4, v=13)
    assert torch.autograd.gradcheck(
        lambda h, w: ChunkedLogProbs.apply(h, w, tokens, 0.8, chunk, True),
        (hidden, weight),
    )


@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("with_entropy", [True, False])
def test_matches_full_logits_in_float32(temperature, with_entropy):
    hidden, weight, tokens = _inputs(torch.float32, seed=1)
    g = torch.Generator().manual_seed(2)
    upstream = torch.randn(K, 2, generator=g)
    if not with_entropy:
        upstream[:, 1] = 0
    out = ChunkedLogProbs.apply(hidden, weight, tokens, temperature, 8, with_entropy)
    (out * upstream).sum().backward()
    got = (out.detach(), hidden.grad.clone(), weight.grad.clone())
    hidden.grad = weight.grad = None
    ref = _full(hidden, weight, tokens, temperature)
    (ref * upstream).sum().backward()
    torch.testing.assert_close(got[0][:, 0], ref.detach()[:, 0], rtol=1e-5, atol=1e-5)
    if with_entropy:
        torch.testing.assert_close(got[0][:, 1], ref.detach()[:, 1], rtol=1e-5, atol=1e-5)
    else:
        assert torch.equal(got[0][:, 1], torch.zeros(K))
    torch.testing.assert_close(got[1], hidden.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[2], weight.grad, rtol=1e-5, atol=1e-5)


def test_backward_keeps_no_vocabulary_sized_tensor():
    hidden, weight, tokens = _inputs(torch.float32)
    out = ChunkedLogProbs.apply(hidden, weight, tokens, 1.0, 8, True)
    saved = out.grad_fn.saved_tensors
    sizes = sorted(t.numel() for t in saved)
    # hidden [K, D], weight [V, D] (the parameter itself), tokens and log-sum-exp [K]
    assert sizes == sorted([K * D, V * D, K, K])


def test_head_is_a_linear_until_a_request_is_set():
    torch.manual_seed(0)
    model = torch.nn.Module()
    model.lm_head = torch.nn.Linear(D, V, bias=False)
    model.get_output_embeddings = lambda: model.lm_head
    before = dict(model.state_dict())
    head = install_log_prob_head(model)
    assert isinstance(head, LogProbHead) and install_log_prob_head(model) is head
    assert list(model.state_dict()) == list(before)
    x = torch.randn(2, 3, D)
    torch.testing.assert_close(head(x), x @ head.weight.t())
    tokens = torch.tensor([4, 9])
    head.request = LogProbRequest(torch.tensor([1, 5]), tokens, with_entropy=True)
    out = head(x)
    flat = x.reshape(-1, D)[[1, 5]]
    torch.testing.assert_close(out, _full(flat, head.weight, tokens, 1.0))


def test_heads_with_a_bias_keep_full_logits():
    model = torch.nn.Module()
    model.lm_head = torch.nn.Linear(D, V, bias=True)
    model.get_output_embeddings = lambda: model.lm_head
    assert install_log_prob_head(model) is None
    assert type(model.lm_head) is torch.nn.Linear
