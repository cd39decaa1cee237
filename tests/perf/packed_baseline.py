"""The plain packed baseline of the actor benchmarks (issue 22), sharing no code with
``trainer.workers``: the batch's samples packed first-fit into rows of ``row_tokens`` real
tokens (no padding), each row one forward/backward; per-sample causal SDPA (no attention
across samples, no mask); bf16 autocast over fp32 weights on CUDA (fp32 on CPU); every decoder
layer checkpointed; log-probs through the LM head in checkpointed chunks of ``chunk``
positions, only where a token was sampled, so no [tokens, vocab] logits are held; the GRPO
token-mean clipped loss (dual clip, as ``trainer.algos.policy_loss_tokens``), gradient
clipping at 1 and one AdamW step per batch.

Runs on a whole transformers Qwen3 (its modules, this file's layer forward and attention).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from tests.perf.actor_workload import sample_lengths
from trainer.workers import TrainBatch


def pack_rows(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """First-fit decreasing: sample indices per row, each row at most ``capacity`` tokens."""
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if lengths[i] > capacity:
            raise ValueError(f"sample {i} has {lengths[i]} tokens, over a row of {capacity}")
        for r, free in enumerate(room):
            if lengths[i] <= free:
                rows[r].append(i)
                room[r] -= lengths[i]
                break
        else:
            rows.append([i])
            room.append(capacity - lengths[i])
    return rows


@dataclass(frozen=True, slots=True)
class PackedRow:
    input_ids: torch.Tensor
    """[1, tokens] the samples' real tokens back to back."""
    position_ids: torch.Tensor
    """[1, tokens] restarting at 0 for each sample."""
    bounds: tuple[int, ...]
    """Sample k spans ``bounds[k]:bounds[k + 1]``."""
    predictors: torch.Tensor
    """[k] index in the row of the position predicting each sampled token."""
    targets: torch.Tensor
    """[k] the sampled tokens."""
    cell: tuple[torch.Tensor, torch.Tensor]
    """([k] sample, [k] response column) of each sampled token in the batch."""


def packed_row(batch: TrainBatch, samples: list[int]) -> PackedRow:
    p = batch.prompt_length
    ids, pos, bounds, predictors, targets, rows, cols = [], [], [0], [], [], [], []
    for i in samples:
        real = batch.attention_mask[i].bool()
        prompt_len = int(real[:p].sum())
        sampled = batch.response_mask[i].nonzero().squeeze(1)  # response columns
        ids.append(batch.input_ids[i][real])
        pos.append(torch.arange(int(real.sum())))
        predictors.append(bounds[-1] + prompt_len + sampled - 1)
        targets.append(batch.input_ids[i, p + sampled])
        rows.append(torch.full_like(sampled, i))
        cols.append(sampled)
        bounds.append(bounds[-1] + len(ids[-1]))
    return PackedRow(
        torch.cat(ids)[None], torch.cat(pos)[None], tuple(bounds),
        torch.cat(predictors), torch.cat(targets), (torch.cat(rows), torch.cat(cols)),
    )  # fmt: skip


def _per_sample_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: tuple[int, ...], scale: float
) -> torch.Tensor:
    """q [1, heads, T, d], k/v [1, kv_heads, T, d] -> [1, T, heads, d], causal per sample."""
    q, k = q.to(v.dtype), k.to(v.dtype)  # rotary/norm outputs are fp32 under autocast
    # split, not slices: the backward of a split is one cat, a slice's a zero-filled full tensor
    sizes = [e - s for s, e in zip(bounds[:-1], bounds[1:], strict=True)]
    out = [
        F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale, enable_gqa=True)
        for qs, ks, vs in zip(q.split(sizes, 2), k.split(sizes, 2), v.split(sizes, 2), strict=True)
    ]
    return torch.cat(out, dim=2).transpose(1, 2)


def _decoder_layer(layer, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bounds):
    """A Qwen3 decoder layer written out (its modules, our attention)."""
    from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

    attn = layer.self_attn
    x = layer.input_layernorm(h)
    heads = (*x.shape[:-1], -1, attn.head_dim)
    q = attn.q_norm(attn.q_proj(x).view(heads)).transpose(1, 2)
    k = attn.k_norm(attn.k_proj(x).view(heads)).transpose(1, 2)
    v = attn.v_proj(x).view(heads).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    o = _per_sample_attention(q, k, v, bounds, attn.scaling)
    h = h + attn.o_proj(o.reshape(*x.shape[:-1], -1))
    return h + layer.mlp(layer.post_attention_layernorm(h))


def _chunk_log_probs(h: torch.Tensor, weight: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    logits = F.linear(h, weight).float()  # [chunk, vocab]
    return logits.gather(-1, tokens[:, None]).squeeze(-1) - torch.logsumexp(logits, -1)


def grpo_token_losses(
    logp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, clip: float = 0.2, clip_c: float = 3.0
) -> torch.Tensor:
    """PPO clipped surrogate per token, dual-clipped (at ``clip_c``) for negative advantages."""
    ratio = torch.exp((logp - old).clamp(-20.0, 20.0))
    clipped = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip))
    return torch.where(adv < 0, torch.minimum(clipped, -adv * clip_c), clipped)


class PackedBaseline:
    """The plain packed actor (module docstring) on a whole transformers Qwen3 model."""

    def __init__(
        self, model, device: str, *, row_tokens: int = 8192, chunk: int = 2048, lr: float = 1e-6
    ):
        self.model, self.device = model, device
        self.row_tokens, self.chunk = row_tokens, chunk
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)

    def _autocast(self):
        return torch.autocast("cuda", torch.bfloat16, enabled=self.device == "cuda")

    def _row_log_probs(self, row: PackedRow, train: bool) -> torch.Tensor:
        """[k] log-probs of the row's sampled tokens."""
        inner, dev = self.model.model, self.device
        ids, pos = row.input_ids.to(dev), row.position_ids.to(dev)
        predictors, targets = row.predictors.to(dev), row.targets.to(dev)
        with self._autocast():
            h = inner.embed_tokens(ids)
            cos, sin = inner.rotary_emb(h, pos)
            for layer in inner.layers:
                if train:
                    h = checkpoint(
                        _decoder_layer, layer, h, cos, sin, row.bounds, use_reentrant=False
                    )
                else:
                    h = _decoder_layer(layer, h, cos, sin, row.bounds)
            h = inner.norm(h)[0].index_select(0, predictors)  # [k, d]
            weight = self.model.lm_head.weight
            parts = []
            for s in range(0, len(targets), self.chunk):
                args = (h[s : s + self.chunk], weight, targets[s : s + self.chunk])
                parts.append(
                    checkpoint(_chunk_log_probs, *args, use_reentrant=False)
                    if train
                    else _chunk_log_probs(*args)
                )
        return torch.cat(parts)

    def _rows(self, batch: TrainBatch) -> list[PackedRow]:
        return [packed_row(batch, r) for r in pack_rows(sample_lengths(batch), self.row_tokens)]

    @torch.no_grad()
    def log_probs(self, batch: TrainBatch) -> torch.Tensor:
        """[batch, R] log-probs of the sampled tokens (0 elsewhere)."""
        self.model.eval()
        out = torch.zeros(batch.response_mask.shape, dtype=torch.float32)
        for row in self._rows(batch):
            out[row.cell] = self._row_log_probs(row, train=False).cpu()
        return out

    def update(self, batch: TrainBatch) -> dict[str, float]:
        """One optimizer step on ``batch``: token-mean GRPO loss, a backward per row."""
        assert batch.old_log_probs is not None and batch.advantages is not None
        self.model.train()
        denominator = max(float(batch.response_mask.sum()), 1.0)
        for row in self._rows(batch):
            logp = self._row_log_probs(row, train=True)
            old = batch.old_log_probs[row.cell].to(self.device)
            adv = batch.advantages[row.cell].to(self.device)
            (grpo_token_losses(logp, old, adv).sum() / denominator).backward()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"actor/grad_norm": float(norm)}


def load_baseline_model(path: str, device: str) -> torch.nn.Module:
    """The saved model as fp32 master weights on ``device`` (no FSDP, no checkpointing flag:
    this file checkpoints the layers itself)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device)
