"""Workload of the actor benchmarks (issue 22): an agentic GRPO batch, random Qwen3 models of
the 0.6B and 1.7B shapes, the FLOPs their forward/backward performs, the project's FSDP2 actor
as the trainer runs it, and a timing harness shared by every method measured.

The batch (``agentic_batch``): ``prompts`` x ``n`` samples in ``TrainBatch`` layout, each
group sharing its prompt (uniform length), each response lognormal in length and multi-turn:
assistant spans with tool-result spans between them (``response_mask`` 0 on a tool span,
``tool_share`` of the response). Advantages are GRPO's: a random reward normalised within the
group, on every sampled token.

The baseline the project is measured against is ``tests.perf.packed_baseline``.

FLOPs (``forward_flops``) are model FLOPs, as in MFU: the linear layers on every real token,
causal attention within each sample (s(s+1)/2 query-key pairs; no padding, no cross-sample
pairs), the LM head only where a log-prob is needed (sampled tokens); a backward is twice the
forward. Recomputation by activation checkpointing and work on padding are not counted, so
every method is measured against the same useful work.
"""

from __future__ import annotations

import gc
import math
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from trainer.config.actor import ActorConfig, FSDPConfig, ModelConfig
from trainer.workers import TrainBatch, log_probs_in_micro_batches, update_policy
from trainer.workers.fsdp import apply_fsdp, init_distributed, load_model
from trainer.workers.fsdp_worker import adamw

# ---- the batch -----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class AgenticBatchSpec:
    prompts: int = 8
    n: int = 8
    """Samples per prompt (GRPO group)."""
    prompt_len: tuple[int, int] = (300, 600)
    """Inclusive range of a prompt's length (uniform)."""
    response_median: int = 900
    response_sigma: float = 0.65
    """Lognormal sigma of the response length (mean ~1.2x the median)."""
    response_cap: int = 4096
    tool_share: float = 0.25
    """Share of a response's tokens that are tool results (response_mask 0)."""
    max_tool_calls: int = 4
    vocab_size: int = 151936
    seed: int = 1
    """The defaults draw 98,150 real tokens (issue 22's batch had 98,067)."""


def _split(total: int, parts: int, g: torch.Generator) -> list[int]:
    """``total`` as ``parts`` random positive integers."""
    cuts = (torch.randperm(total - 1, generator=g)[: parts - 1] + 1).sort().values.tolist()
    edges = [0, *cuts, total]
    return [b - a for a, b in zip(edges[:-1], edges[1:], strict=True)]


def _turn_mask(length: int, spec: AgenticBatchSpec, g: torch.Generator) -> torch.Tensor:
    """[length] 1 on assistant spans, 0 on tool spans: A T A ... T A."""
    calls = min(int(torch.randint(1, spec.max_tool_calls + 1, (1,), generator=g)), length // 4)
    if calls == 0:
        return torch.ones(length, dtype=torch.long)
    tool = min(max(round(spec.tool_share * length), calls), length - calls - 1)
    said, heard = _split(length - tool, calls + 1, g), _split(tool, calls, g)
    spans = [torch.ones(said[0], dtype=torch.long)]
    for t, a in zip(heard, said[1:], strict=True):
        spans += [torch.zeros(t, dtype=torch.long), torch.ones(a, dtype=torch.long)]
    return torch.cat(spans)


def agentic_batch(spec: AgenticBatchSpec) -> TrainBatch:
    """A seeded agentic GRPO batch (no log-probs: each method computes its own)."""
    g = torch.Generator().manual_seed(spec.seed)
    size = spec.prompts * spec.n
    lo, hi = spec.prompt_len
    prompt_lens = torch.randint(lo, hi + 1, (spec.prompts,), generator=g).repeat_interleave(spec.n)
    noise = torch.randn(size, generator=g, dtype=torch.float64)
    resp_lens = (spec.response_median * torch.exp(spec.response_sigma * noise)).round()
    resp_lens = resp_lens.clamp(8, spec.response_cap).long()
    p, r = int(prompt_lens.max()), int(resp_lens.max())
    input_ids = torch.zeros(size, p + r, dtype=torch.long)
    attention_mask = torch.zeros(size, p + r, dtype=torch.long)
    response_mask = torch.zeros(size, r, dtype=torch.long)
    prompts = [torch.randint(0, spec.vocab_size, (hi,), generator=g) for _ in range(spec.prompts)]
    for i in range(size):
        pl, rl = int(prompt_lens[i]), int(resp_lens[i])
        input_ids[i, p - pl : p] = prompts[i // spec.n][:pl]
        input_ids[i, p : p + rl] = torch.randint(0, spec.vocab_size, (rl,), generator=g)
        attention_mask[i, p - pl : p + rl] = 1
        response_mask[i, :rl] = _turn_mask(rl, spec, g)
    rewards = torch.rand(spec.prompts, spec.n, generator=g)
    scores = (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-6)
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=(attention_mask.cumsum(1) - 1).clamp(min=0),
        response_mask=response_mask,
        advantages=scores.reshape(size, 1) * response_mask,
    )


def sample_lengths(batch: TrainBatch) -> list[int]:
    return batch.attention_mask.sum(-1).tolist()


def batch_stats(batch: TrainBatch) -> dict[str, int]:
    prompt, response = batch.lengths()
    sampled = int(batch.response_mask.sum())
    return {
        "samples": len(batch),
        "real_tokens": int(prompt.sum() + response.sum()),
        "prompt_tokens": int(prompt.sum()),
        "response_tokens": int(response.sum()),
        "sampled_tokens": sampled,
        "tool_tokens": int(response.sum()) - sampled,
        "longest_sample": int((prompt + response).max()),
    }


# ---- models and FLOPs ----------------------------------------------------------------------

QWEN3_SHAPES: dict[str, dict[str, int]] = {
    "0.6B": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936),
    "1.7B": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936),
    "mini": dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=4096),
}  # fmt: skip
"""Qwen3 shapes (published configs of Qwen3-0.6B / 1.7B; tied embeddings) and a CPU miniature."""


def qwen3_config(shape: str):
    from transformers import Qwen3Config

    return Qwen3Config(
        **QWEN3_SHAPES[shape], tie_word_embeddings=True, max_position_embeddings=40960
    )


def save_random_qwen3(shape: str, path: Path, device: str, seed: int = 0) -> Path:
    """A randomly initialised Qwen3 of ``shape`` saved (bf16 on disk) to ``path``; built on
    ``device`` because initialising 1.7B parameters on a CPU takes minutes."""
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen3ForCausalLM(qwen3_config(shape))
    model.to(torch.bfloat16).save_pretrained(path)
    del model
    release_memory()
    return path


def forward_flops(config, lengths: Sequence[int], head_positions: int) -> float:
    """Model FLOPs of one forward over samples of ``lengths`` real tokens, with the LM head on
    ``head_positions`` positions (see the module docstring)."""
    d, layers = config.hidden_size, config.num_hidden_layers
    q = config.num_attention_heads * config.head_dim
    kv = config.num_key_value_heads * config.head_dim
    per_token = 2 * layers * (d * q + 2 * d * kv + q * d + 3 * d * config.intermediate_size)
    attention = 2 * layers * q * sum(s * (s + 1) for s in lengths)
    head = 2 * d * config.vocab_size * head_positions
    return per_token * sum(lengths) + attention + head


def matmul_peak_flops(device: str) -> float:
    """Best measured dense matmul FLOP/s: bf16 8192^3 on CUDA, fp32 1024^3 on CPU."""
    n, dtype = (8192, torch.bfloat16) if device == "cuda" else (1024, torch.float32)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = math.inf
    for _ in range(4):  # the first round warms up
        sync(device)
        start = time.perf_counter()
        for _ in range(10):
            a @ b
        sync(device)
        best = min(best, (time.perf_counter() - start) / 10)
    return 2 * n**3 / best


# ---- timing harness ------------------------------------------------------------------------


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def release_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def time_actor(
    log_probs: Callable[[TrainBatch], torch.Tensor],
    update: Callable[[TrainBatch], dict[str, float]],
    batch: TrainBatch,
    warmup: TrainBatch,
    device: str,
    out: dict,
    *,
    repeat: bool = False,
) -> torch.Tensor:
    """Log-prob pass then one update of ``batch`` (old log-probs = that pass's), after the
    same on ``warmup`` (kernels, allocator, optimizer state). Fills ``out`` as it goes
    (``phase``, ``log_prob_s``, ``update_s``, metrics) so an OOM leaves the earlier numbers.

    The timed pass meets ``batch``'s sample lengths for the first time, as each training step
    does. ``repeat``: the same pass again (``log_prob_repeat_s``, ``update_repeat_s``), where
    whatever a kernel library builds per shape (cuDNN attention plans) is already built."""
    out["phase"] = "warm-up"
    update(replace(warmup, old_log_probs=log_probs(warmup)))
    sync(device)
    for suffix in ("", "_repeat") if repeat else ("",):
        out["phase"] = "log_prob" + suffix
        start = time.perf_counter()
        logp = log_probs(batch)
        sync(device)
        out[f"log_prob{suffix}_s"] = time.perf_counter() - start
        out["phase"] = "update" + suffix
        start = time.perf_counter()
        metrics = update(replace(batch, old_log_probs=logp))
        sync(device)
        out[f"update{suffix}_s"] = time.perf_counter() - start
        out["grad_norm"] = metrics.get("actor/grad_norm")
    del out["phase"]
    return logp


def guarded(
    run: Callable[[dict], torch.Tensor | None], device: str
) -> tuple[dict, torch.Tensor | None]:
    """``run(out)`` with CUDA peak memory measured and an out-of-memory error reported as
    ``status: OOM`` (``phase``: where it ran out) rather than raised."""
    out: dict = {"status": "ok"}
    release_memory()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    logp = None
    try:
        logp = run(out)
    except torch.OutOfMemoryError:
        out["status"] = "OOM"
    if device == "cuda":
        out["peak_gb"] = torch.cuda.max_memory_allocated() / 2**30
    release_memory()
    return out, logp


def padded_slots(batch: TrainBatch, groups: list[torch.Tensor]) -> int:
    """Token slots a padded forward of ``groups`` computes: rows x the trimmed width."""
    return sum(batch.select(idx).trimmed().input_ids.numel() for idx in groups)


# ---- the project's actor -------------------------------------------------------------------


@contextmanager
def single_rank_group(device: str) -> Iterator[None]:
    """A one-rank process group (FSDP2 needs one), torn down afterwards."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    init_distributed(0, 1, f"127.0.0.1:{port}", device)
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()


class ProjectActor:
    """The project's FSDP2 actor as ``FSDPWorker`` runs it: ``load_model`` -> ``apply_fsdp``
    (bf16 mixed precision on CUDA), AdamW, dynamic micro-batches of ``max_tokens``, one
    optimizer step per batch. ``old=True``: rows padded to the micro-batch's longest and
    full-vocabulary logits (``remove_padding=False``, ``log_prob_chunk_size=0``); else the
    defaults (packed, chunked LM head). ``shared_prefix``: ``actor.shared_prefix``."""

    def __init__(
        self,
        path: Path,
        device: str,
        *,
        max_tokens: int,
        old: bool,
        checkpointing: bool,
        shared_prefix: bool = False,
    ):
        self.remove_padding = not old
        model_cfg = ModelConfig(
            path=str(path),
            enable_gradient_checkpointing=checkpointing,
            use_remove_padding=self.remove_padding,
        )
        self.model = apply_fsdp(load_model(str(path), model_cfg, device), FSDPConfig(), device)
        self.cfg = ActorConfig(
            use_dynamic_bsz=True,
            ppo_max_token_len_per_gpu=max_tokens,
            shared_prefix=shared_prefix,
            **({"log_prob_chunk_size": 0} if old else {}),
        )
        self.optimizer = adamw(self.model, self.cfg.optim)

    def log_probs(self, batch: TrainBatch) -> torch.Tensor:
        self.model.eval()
        try:
            return log_probs_in_micro_batches(
                self.model,
                batch,
                micro_batch_size=self.cfg.log_prob_micro_batch_size,
                use_dynamic_bsz=True,
                max_token_len=self.cfg.ppo_max_token_len_per_gpu,
                remove_padding=self.remove_padding,
                chunk_size=self.cfg.log_prob_chunk_size,
                shared_prefix=self.cfg.shared_prefix,
            )[0]
        finally:
            self.model.train()

    def update(self, batch: TrainBatch) -> dict[str, float]:
        return update_policy(
            self.model,
            self.optimizer,
            None,
            batch,
            self.cfg,
            samples_per_mini_batch=len(batch),
            remove_padding=self.remove_padding,
        )


def two_cpu_ranks(path: str, actor: ActorConfig, balance: bool = False):
    """A ``WorkerGroup`` of 2 FSDP2 gloo ranks (Ray actors) training ``actor`` on the model at
    ``path``, without a reference policy; Ray is imported here, not with this module."""
    from trainer.config.actor import RefConfig
    from trainer.workers import WorkerGroup, WorkerSpec

    spec = WorkerSpec(
        model_path=path,
        model=ModelConfig(path=path),
        actor=actor,
        ref=RefConfig(),
        need_ref=False,
        device="cpu",
    )
    return WorkerGroup(spec, world_size=2, balance=balance)
