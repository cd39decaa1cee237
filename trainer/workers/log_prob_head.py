"""Log-probs and entropy of chosen tokens straight from the LM head, a chunk of positions at a
time, never holding [tokens, vocab] logits for a whole micro-batch.

``ChunkedLogProbs`` is an autograd function of (hidden [k, d], head weight [vocab, d]): forward
computes each chunk's fp32 logits, keeps only log-sum-exp and entropy per position, and drops
the logits; backward recomputes them chunk by chunk. Peak extra memory is a few
[chunk, vocab] fp32 tensors, whatever the micro-batch size.

The head runs inside the model's own forward (``install_log_prob_head`` turns ``lm_head`` into
a ``LogProbHead``), so under FSDP2 its weight is used while the root module has it gathered
and its gradient is reduced like any other.

Gradients, with z the logits / temperature, p = softmax(z), lse = logsumexp(z),
H = lse - sum(p z): d log p_t / dz = onehot(t) - p and dH / dz = -p (z - sum(p z)).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "ChunkedLogProbs",
    "LogProbHead",
    "LogProbRequest",
    "install_log_prob_head",
    "scaled_logits",
    "token_log_probs",
]


def scaled_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Logits / temperature in fp32 (fp64 for fp64 inputs)."""
    z = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return z / temperature if temperature != 1.0 else z


def token_log_probs(
    z: torch.Tensor, tokens: torch.Tensor, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(log p(token), entropy or None, log-sum-exp) of scaled logits ``z`` [k, vocab]."""
    lse = torch.logsumexp(z, dim=-1)
    log_probs = z.gather(-1, tokens[:, None]).squeeze(-1) - lse
    entropy = lse - (torch.softmax(z, dim=-1) * z).sum(-1) if with_entropy else None
    return log_probs, entropy, lse


def _chunk_logits(h: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    return scaled_logits(h @ weight.t(), temperature)


class ChunkedLogProbs(torch.autograd.Function):
    """(hidden [k, d], weight [vocab, d], tokens [k]) -> [k, 2]: log p(token), entropy."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        tokens: torch.Tensor,
        temperature: float,
        chunk: int,
        with_entropy: bool,
    ) -> torch.Tensor:
        acc = torch.promote_types(hidden.dtype, torch.float32)
        out = torch.empty(hidden.shape[0], 2, dtype=acc, device=hidden.device)
        lse = torch.empty(hidden.shape[0], dtype=acc, device=hidden.device)
        for s in range(0, hidden.shape[0], chunk):
            z = _chunk_logits(hidden[s : s + chunk], weight, temperature)
            lp, ent, lse[s : s + chunk] = token_log_probs(z, tokens[s : s + chunk], with_entropy)
            out[s : s + chunk, 0] = lp
            out[s : s + chunk, 1] = 0.0 if ent is None else ent
            del z
        ctx.save_for_backward(hidden, weight, tokens, lse)
        ctx.temperature, ctx.chunk, ctx.with_entropy = temperature, chunk, with_entropy
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        hidden, weight, tokens, lse = ctx.saved_tensors
        t, chunk = ctx.temperature, ctx.chunk
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden) if need_h else None
        acc = torch.promote_types(weight.dtype, torch.float32)
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device)
        for s in range(0, hidden.shape[0], chunk):
            h = hidden[s : s + chunk]
            z = _chunk_logits(h, weight, t)
            p = torch.exp(z - lse[s : s + chunk, None])
            g_lp = grad_out[s : s + chunk, 0, None]
            g = p * -g_lp
            if ctx.with_entropy:
                g_ent = grad_out[s : s + chunk, 1, None]
                mean_z = (p * z).sum(-1, keepdim=True)  # not lse - H: that cancels
                g -= g_ent * p * (z - mean_z)
            del z, p
            g.scatter_add_(-1, tokens[s : s + chunk, None], g_lp)
            if t != 1.0:
                g /= t
            g = g.to(weight.dtype)
            if need_h:
                grad_h[s : s + chunk] = g @ weight  # type: ignore[index]
            if need_w:
                grad_w += g.t() @ h
        return grad_h, grad_w.to(weight.dtype) if need_w else None, None, None, None, None


@dataclass(frozen=True, slots=True)
class LogProbRequest:
    """What the head computes on its next call instead of logits."""

    positions: torch.Tensor
    """[k] flat indices into the head input's [rows * length] positions."""
    tokens: torch.Tensor
    """[k] token whose log-prob each position gives."""
    temperature: float = 1.0
    chunk: int = 2048
    with_entropy: bool = False


class LogProbHead(torch.nn.Linear):
    """An ``nn.Linear`` LM head (same parameters and state-dict names) that, while a
    ``request`` is set, returns [k, 2] (log-prob, entropy) of the requested positions."""

    request: LogProbRequest | None = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        req = self.request
        if req is None:
            return super().forward(hidden)
        flat = hidden.reshape(-1, hidden.shape[-1]).index_select(0, req.positions)
        return ChunkedLogProbs.apply(
            flat, self.weight, req.tokens, req.temperature, max(req.chunk, 1), req.with_entropy
        )


def install_log_prob_head(model: torch.nn.Module) -> LogProbHead | None:
    """Turn ``model``'s output embedding into a ``LogProbHead`` (idempotent). None when the
    head is not a bias-free ``nn.Linear`` or the model post-processes logits (soft-capping):
    such models take the full-logits path."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if isinstance(head, LogProbHead):
        return head
    config = getattr(model, "config", None)
    if (
        type(head) is not torch.nn.Linear
        or head.bias is not None
        or getattr(config, "final_logit_softcapping", None)
    ):
        return None
    head.__class__ = LogProbHead
    return head  # type: ignore[return-value]
