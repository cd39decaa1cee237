"""``TrainBatch``: the named tensors the FSDP2 workers train on, and how a rank's share is cut
into micro-batches.

Layout (from ``agentloop.RolloutBatch``): prompts left-padded to P, responses right-padded to
R, so ``input_ids[:, P:]`` is the response and ``logits[:, P-1:P+R-1]`` predict it. A
micro-batch is trimmed to the longest prompt and response it holds, which keeps the layout
and drops columns that are padding in every row.

Every rank must run the same number of forwards and optimizer steps (FSDP's collectives), so
a batch is shared out in equal parts. A batch whose sample count does not split evenly over
the ranks and mini-batches (a gateway session's segments add samples) is filled up with
filler rows (``pad_for_ranks``): one prompt token, nothing to train (response mask 0,
weight 0, advantage 0), so they change no loss, gradient or normaliser. A row whose gradient
is exactly 0 (``trainer.workers.inert``) may be turned into such a filler too, standing in for
it (``skipping``): the token-mean normaliser still counts its tokens (``stand_in_tokens``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

__all__ = [
    "TrainBatch",
    "balanced_micro_batches",
    "fixed_micro_batches",
    "pad_for_ranks",
    "spread_rows",
]


@dataclass(slots=True)
class TrainBatch:
    input_ids: torch.Tensor
    """[batch, P + R] prompt (left-padded) then response (right-padded)."""
    attention_mask: torch.Tensor
    """[batch, P + R] 1 on real tokens."""
    position_ids: torch.Tensor
    """[batch, P + R]"""
    response_mask: torch.Tensor
    """[batch, R] 1 on tokens the model sampled (the loss mask)."""
    old_log_probs: torch.Tensor | None = None
    """[batch, R] log-probs of the policy that sampled (computed by the trainer)."""
    ref_log_probs: torch.Tensor | None = None
    """[batch, R] reference policy log-probs (only with a KL term)."""
    advantages: torch.Tensor | None = None
    """[batch, R]"""
    rollout_log_probs: torch.Tensor | None = None
    """[batch, R] the engine's log-probs (behaviour policy; only with a rollout correction)."""
    is_weights: torch.Tensor | None = None
    """[batch, R] the rollout correction's importance weights where the driver computed them
    for the whole batch (``CorrectionSpec.needs_whole_batch``); None: the loss computes them,
    or there are none."""
    values: torch.Tensor | None = None
    """[batch, R] the critic's values of the states before each sampled token (GAE only)."""
    returns: torch.Tensor | None = None
    """[batch, R] the critic's regression targets (GAE: advantages + values)."""
    weights: torch.Tensor | None = None
    """[batch] float32 sample weights (``SampleRecord.weight``: a gateway session's k
    segments 1/k each, filler rows 0); None: 1 each. The advantages already carry them; the
    ``seq-mean-*`` loss normalisers count sequences by them."""
    stand_in_tokens: torch.Tensor | None = None
    """[batch] float32: on a filler standing in for a row the update skips (``skipping``), that
    row's sampled tokens, which the ``token-mean`` normaliser still counts; 0 on other rows.
    None: no row skipped."""

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def response_length(self) -> int:
        return self.response_mask.shape[1]

    @property
    def prompt_length(self) -> int:
        return self.input_ids.shape[1] - self.response_length

    @property
    def responses(self) -> torch.Tensor:
        return self.input_ids[:, self.prompt_length :]

    def _map(self, fn) -> TrainBatch:
        return TrainBatch(
            **{
                f.name: None if getattr(self, f.name) is None else fn(getattr(self, f.name))
                for f in dataclasses.fields(self)
            }
        )

    def select(self, index: torch.Tensor | slice) -> TrainBatch:
        """Rows ``index`` of every field."""
        return self._map(lambda t: t[index])

    def chunk(self, n: int) -> list[TrainBatch]:
        """``n`` contiguous equal parts (the batch size must divide)."""
        if len(self) % n:
            raise ValueError(f"batch of {len(self)} samples does not split into {n} equal parts")
        size = len(self) // n
        return [self.select(slice(i * size, (i + 1) * size)) for i in range(n)]

    @staticmethod
    def cat(parts: list[TrainBatch]) -> TrainBatch:
        first = parts[0]
        return TrainBatch(
            **{
                f.name: None
                if getattr(first, f.name) is None
                else torch.cat([getattr(p, f.name) for p in parts])
                for f in dataclasses.fields(first)
            }
        )

    def with_fillers(self, index: torch.Tensor) -> TrainBatch:
        """Rows ``index`` of this batch, with a filler row wherever ``index`` is -1: one
        prompt token (the first row's last), no response, every mask, log-prob, advantage and
        weight 0. ``self`` itself when ``index`` is ``arange(len(self))``."""
        real = index >= 0
        if bool(real.all()) and torch.equal(index, torch.arange(len(self))):
            return self
        return self.select(index.clamp(min=0))._filled(~real)

    def skipping(self, rows: torch.Tensor) -> TrainBatch:
        """This batch with ``rows`` (a bool mask) turned into fillers that stand in for them:
        each keeps its row's sampled-token count in ``stand_in_tokens`` for the token-mean
        normaliser, and its forward is one prompt token. For rows whose gradient is 0
        (``trainer.workers.inert``), whose update is then the same."""
        out = self.select(torch.arange(len(self)))  # a copy: fillers are made in place
        counts = self.response_mask.sum(-1).to(torch.float32)
        kept = torch.zeros(len(self)) if self.stand_in_tokens is None else self.stand_in_tokens
        out._filled(rows)
        out.stand_in_tokens = torch.where(rows, kept + counts, kept)
        return out

    def _filled(self, fill: torch.Tensor) -> TrainBatch:
        """Rows ``fill`` (a bool mask) made fillers, in place: the last prompt token alone, every
        mask, log-prob, advantage, weight and stand-in count 0."""
        p = self.prompt_length
        weights = self.weights if self.weights is not None else torch.ones(len(self))
        self.weights = torch.where(fill, 0.0, weights.to(torch.float32))
        for name in ("attention_mask", "position_ids", "response_mask"):
            getattr(self, name)[fill] = 0
        self.attention_mask[fill, p - 1] = 1
        for name in (
            "old_log_probs",
            "ref_log_probs",
            "advantages",
            "rollout_log_probs",
            "is_weights",
            "values",
            "returns",
            "stand_in_tokens",
        ):
            value = getattr(self, name)
            if value is not None:
                value[fill] = 0
        return self

    def lengths(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Real (prompt, response) token counts per row."""
        p = self.prompt_length
        return self.attention_mask[:, :p].sum(-1), self.attention_mask[:, p:].sum(-1)

    def trimmed(self) -> TrainBatch:
        """The same rows without the columns that are padding in all of them."""
        prompt_len, resp_len = self.lengths()
        p, r = self.prompt_length, self.response_length
        keep_p, keep_r = max(int(prompt_len.max()), 1), max(int(resp_len.max()), 1)
        seq = slice(p - keep_p, p + keep_r)

        def cut(t: torch.Tensor) -> torch.Tensor:
            if t.dim() == 1:  # per-sample values (weights)
                return t
            return t[:, seq] if t.shape[1] == p + r else t[:, :keep_r]

        return self._map(cut)


def fixed_micro_batches(n: int, size: int) -> list[torch.Tensor]:
    """Index groups of ``size`` consecutive rows."""
    return [torch.arange(i, min(i + size, n)) for i in range(0, n, size)]


def balanced_micro_batches(
    tokens: torch.Tensor, max_tokens: int, min_count: int = 1, *, packed: bool = False
) -> list[torch.Tensor]:
    """Split rows into as few micro-batches as fit ``max_tokens`` tokens each, at least
    ``min_count`` (ranks must run the same number of forwards), balancing token counts:
    longest rows first, each into the lightest group. A group's tokens are what its forward
    holds: the sum of its rows' tokens when ``packed`` (no padding), else rows x its
    longest row.

    Returns index tensors, each sorted; groups never empty when ``min_count <= len(tokens)``.
    """
    n = len(tokens)
    order = torch.argsort(tokens, descending=True, stable=True).tolist()
    longest = int(tokens.max()) if n else 0
    if longest > max_tokens:
        raise ValueError(
            f"a sample has {longest} tokens, over actor.ppo_max_token_len_per_gpu={max_tokens}: "
            "raise it to at least prompt_length + response_length"
        )
    count = max(min_count, 1)
    while True:
        groups: list[list[int]] = [[] for _ in range(min(count, n))]
        load = [0] * len(groups)
        peak = [0] * len(groups)
        for i in order:
            g = min(range(len(groups)), key=lambda k: (load[k], len(groups[k])))
            groups[g].append(i)
            load[g] += int(tokens[i])
            peak[g] = max(peak[g], int(tokens[i]))
        held = load if packed else [len(g) * peak[k] for k, g in enumerate(groups)]
        if all(h <= max_tokens for h in held) or count >= n:
            return [torch.tensor(sorted(g)) for g in groups if g]
        count += 1


def spread_rows(n: int, cells: int) -> torch.Tensor:
    """[cells * size] row index that cuts ``n`` rows into ``cells`` consecutive parts of
    near-equal size (the first ``n % cells`` one row longer, as ``numpy.array_split``), each
    filled up to ``size = ceil(n / cells)`` with -1 (a filler row). ``arange(n)`` when
    ``cells`` divides ``n``."""
    if n < 1 or cells < 1:
        raise ValueError(f"cannot spread {n} rows over {cells} parts")
    size = -(-n // cells)
    base, extra = divmod(n, cells)
    out = torch.full((cells, size), -1, dtype=torch.long)
    start = 0
    for c in range(cells):
        k = base + int(c < extra)
        out[c, :k] = torch.arange(start, start + k)
        start += k
    return out.reshape(-1)


def pad_for_ranks(
    batch: TrainBatch, world_size: int, mini_batches: int = 1
) -> tuple[TrainBatch, torch.Tensor, int]:
    """``batch`` laid out for ``world_size`` ranks that each run ``mini_batches`` equal
    mini-batches: returns (the batch with filler rows, to ``chunk(world_size)``; [rows] True
    on its real rows, in the original order; rows per rank and mini-batch). Rank r's share
    is the r-th equal part, and its j-th mini-batch (unshuffled) the j-th run of rows of it.
    Without fillers (``world_size * mini_batches`` divides the batch) the batch is returned
    as it is."""
    index = spread_rows(len(batch), world_size * mini_batches)
    per_mini = len(index) // (world_size * mini_batches)
    return batch.with_fillers(index), index >= 0, per_mini
