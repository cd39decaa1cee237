"""Actor benchmark on one GPU (issue 22; marker ``gpu``, skipped without CUDA; torch and
transformers only: no Ray, vLLM or Hydra).

On an agentic GRPO batch (``actor_workload.agentic_batch``: 64 samples, 8 prompts x n=8,
prompts 300-600 tokens, multi-turn responses of lognormal length with 25% tool tokens, ~98k
real tokens) and random Qwen3 models of the 0.6B and 1.7B shapes, each row (shape,
tokens/GPU) measures, in this run and one after another on the same GPU:

- old: the project's FSDP2 actor with padded rows and full-vocabulary logits
  (``remove_padding=False``, ``log_prob_chunk_size=0``),
- new: the same actor with the defaults (packed rows, chunked LM head),
- baseline: ``tests.perf.packed_baseline`` (8k-token packed rows, per-sample SDPA, bf16
  autocast, checkpointed LM-head chunks),

each the log-prob pass and one optimizer step over the whole batch after a warm-up on 8
samples, with gradient checkpointing and dynamic micro-batches of tokens/GPU, timed twice: the
first pass meets the batch's sample lengths for the first time, as every training step does;
the repeat ("rep") runs with whatever is built per shape (cuDNN attention plans) in place.
Prints seconds, MFU against a bf16 matmul peak measured in the run (model FLOPs:
``forward_flops``), peak memory (``torch.cuda.max_memory_allocated``, OOM reported as OOM), the
ratios and the issue's targets (printed, not asserted). Writes bench_results/actor_gpu.json.

``AGENTLOOP_BENCH_ACTOR_MINI=1`` runs the same code on a miniature (tiny Qwen3, 16 samples,
512/1024 tokens/GPU, 512-token baseline rows, 128-position head chunks) on CPU, or on the GPU
if there is one, and writes actor_gpu_mini.json; on CPU (fp32) the three methods' log-probs
must then agree.

    python -m pytest tests/perf/test_bench_actor_gpu.py -s
    AGENTLOOP_BENCH_ACTOR_MINI=1 python -m pytest tests/perf/test_bench_actor_gpu.py -s
"""

from __future__ import annotations

import json
import math
import os
from functools import partial
from pathlib import Path

import pytest
import torch

from tests.perf.actor_workload import (
    AgenticBatchSpec,
    ProjectActor,
    agentic_batch,
    batch_stats,
    forward_flops,
    guarded,
    matmul_peak_flops,
    qwen3_config,
    sample_lengths,
    save_random_qwen3,
    single_rank_group,
    time_actor,
)
from tests.perf.packed_baseline import PackedBaseline, load_baseline_model
from trainer.workers import TrainBatch

MINI = os.environ.get("AGENTLOOP_BENCH_ACTOR_MINI") == "1"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
REPO = Path(__file__).resolve().parents[2]
METHODS = ("old", "new", "baseline")

if MINI:
    ROWS = [("mini", 512), ("mini", 1024)]
    SPEC = AgenticBatchSpec(
        prompts=4, n=4, prompt_len=(30, 60), response_median=90, response_cap=400,
        vocab_size=4096, seed=0,
    )  # fmt: skip
    BASELINE_ROW_TOKENS, BASELINE_CHUNK, WARMUP_SAMPLES = 512, 128, 4
    pytestmark = [pytest.mark.slow]
else:
    ROWS = [("1.7B", 8192), ("1.7B", 16384), ("0.6B", 16384)]
    SPEC = AgenticBatchSpec()
    BASELINE_ROW_TOKENS, BASELINE_CHUNK, WARMUP_SAMPLES = 8192, 2048, 8
    pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def _run(method: str, path: Path, tokens: int, batch: TrainBatch, out: dict) -> torch.Tensor:
    if method == "baseline":
        model = load_baseline_model(str(path), DEVICE)
        actor = PackedBaseline(model, DEVICE, row_tokens=BASELINE_ROW_TOKENS, chunk=BASELINE_CHUNK)
    else:
        actor = ProjectActor(
            path, DEVICE, max_tokens=tokens, old=method == "old", checkpointing=True
        )
    warmup = batch.select(torch.arange(WARMUP_SAMPLES))
    return time_actor(actor.log_probs, actor.update, batch, warmup, DEVICE, out, repeat=True)


def _measure(path: Path, shape: str, tokens: int, batch: TrainBatch, peak: float) -> dict:
    fwd = forward_flops(qwen3_config(shape), sample_lengths(batch), int(batch.response_mask.sum()))
    row: dict = {"shape": shape, "tokens_per_gpu": tokens, "forward_flops": fwd, "methods": {}}
    logps: dict[str, torch.Tensor] = {}
    for method in METHODS:
        out, logp = guarded(partial(_run, method, path, tokens, batch), DEVICE)
        if "log_prob_s" in out:
            out["log_prob_mfu"] = fwd / out["log_prob_s"] / peak
        if "update_s" in out:
            out["update_mfu"] = 3 * fwd / out["update_s"] / peak
        if "update_repeat_s" in out:
            out["update_repeat_mfu"] = 3 * fwd / out["update_repeat_s"] / peak
        if logp is not None:
            logps[method] = logp
        row["methods"][method] = out
    sampled = batch.response_mask.bool()
    if "baseline" in logps:
        for method, logp in logps.items():
            gap = (logp - logps["baseline"])[sampled].abs().max()
            row["methods"][method]["logprob_gap_vs_baseline"] = float(gap)
    return row


def _cell(out: dict, key: str, fmt: str) -> str:
    if key in out:
        return format(out[key], fmt)
    if out["status"] == "OOM":
        return "OOM" if out["phase"] != "warm-up" else "OOM(w-up)"
    return "-"


def _speedup(a: dict, b: dict, key: str) -> str:
    """How many times faster b is than a at ``key`` (time)."""
    return f"{a[key] / b[key]:.2f}x" if key in a and key in b else "n/a"


def _table(results: list[dict], stats: dict, peak: float, device: str) -> list[str]:
    tool = stats["tool_tokens"] / stats["response_tokens"]
    lines = [
        "",
        f"Actor on {device}{' (MINIATURE)' if MINI else ''}: {stats['samples']} samples "
        f"({SPEC.prompts} prompts x n={SPEC.n}), {stats['real_tokens']:,} real tokens "
        f"({stats['prompt_tokens']:,} prompt, {stats['response_tokens']:,} response of which "
        f"{tool:.0%} tool), longest sample {stats['longest_sample']:,}; measured matmul peak "
        f"{peak / 1e12:.3g} TFLOP/s; baseline rows of {BASELINE_ROW_TOKENS} tokens",
        f"  {'shape':<6}{'tok/GPU':>8}  {'method':<9}{'logprob s':>10}{'update s':>10}"
        f"{'MFU lp':>8}{'MFU upd':>9}{'lp rep':>8}{'upd rep':>9}{'MFU rep':>9}{'peak GB':>9}"
        f"{'|dlogp| vs base':>17}",
    ]
    for row in results:
        m = row["methods"]
        for k, method in enumerate(METHODS):
            out = m[method]
            head = f"  {row['shape']:<6}{row['tokens_per_gpu']:>8}" if k == 0 else " " * 16
            lines.append(
                f"{head}  {method:<9}{_cell(out, 'log_prob_s', '.2f'):>10}"
                f"{_cell(out, 'update_s', '.2f'):>10}{_cell(out, 'log_prob_mfu', '.1%'):>8}"
                f"{_cell(out, 'update_mfu', '.1%'):>9}{_cell(out, 'log_prob_repeat_s', '.2f'):>8}"
                f"{_cell(out, 'update_repeat_s', '.2f'):>9}"
                f"{_cell(out, 'update_repeat_mfu', '.1%'):>9}{_cell(out, 'peak_gb', '.1f'):>9}"
                f"{_cell(out, 'logprob_gap_vs_baseline', '.1e'):>17}"
            )
        lines.append(
            " " * 18 + f"new vs old: log-prob {_speedup(m['old'], m['new'], 'log_prob_s')}, "
            f"update {_speedup(m['old'], m['new'], 'update_s')} faster; new vs baseline: "
            f"log-prob {_speedup(m['baseline'], m['new'], 'log_prob_s')}, "
            f"update {_speedup(m['baseline'], m['new'], 'update_s')} "
            f"(repeat: {_speedup(m['baseline'], m['new'], 'update_repeat_s')})"
        )
    return lines


def _targets(results: list[dict]) -> list[str]:
    """Issue 22's targets, judged on the new path (printed, not asserted)."""

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    lines = ["targets (issue 22; printed, not asserted):"]
    for row in results:
        new, base = row["methods"]["new"], row["methods"]["baseline"]
        where = f"{row['shape']} at {row['tokens_per_gpu']} tokens/GPU"
        if row["shape"] == "1.7B" and "update_s" in new:
            ok = "update_s" in base and new["update_s"] <= base["update_s"]
            lines.append(
                f"  {where}: update {new['update_s']:.2f} s vs baseline "
                f"{base.get('update_s', math.nan):.2f} s, MFU {new['update_mfu']:.1%} "
                f"(>= 25%, goal 40%): {verdict(ok and new['update_mfu'] >= 0.25)}"
            )
        if row["shape"] == "1.7B" and row["tokens_per_gpu"] >= 16384:
            lines.append(f"  {where}: no OOM: {verdict(new['status'] == 'ok')}")
        if row["shape"] == "0.6B" and row["tokens_per_gpu"] >= 16384:
            peak = new.get("peak_gb", math.inf)
            lines.append(f"  {where}: peak {peak:.1f} GB <= 30 GB: {verdict(peak <= 30)}")
    if MINI:
        lines.append("  (miniature: the targets apply to the full-size rows)")
    return lines


def test_bench_actor_gpu_project_vs_packed_baseline(tmp_path):
    batch = agentic_batch(SPEC)
    stats = batch_stats(batch)
    peak = matmul_peak_flops(DEVICE)
    device = torch.cuda.get_device_name() if DEVICE == "cuda" else "CPU"
    results = []
    with single_rank_group(DEVICE):
        for shape in dict.fromkeys(s for s, _ in ROWS):
            path = save_random_qwen3(shape, tmp_path / shape, DEVICE)
            results += [_measure(path, shape, t, batch, peak) for s, t in ROWS if s == shape]
    print("\n".join(_table(results, stats, peak, device) + _targets(results)))
    out = REPO / "bench_results"
    out.mkdir(exist_ok=True)
    report = {"device": device, "mini": MINI, "matmul_peak_flops": peak, "batch": stats}
    report["baseline_row_tokens"], report["rows"] = BASELINE_ROW_TOKENS, results
    name = "actor_gpu_mini.json" if MINI else "actor_gpu.json"
    (out / name).write_text(json.dumps(report, indent=1))
    if MINI and DEVICE == "cpu":  # fp32 everywhere: the three methods compute the same thing
        for row in results:
            for method, res in row["methods"].items():
                assert res["status"] == "ok", (method, res)
                assert res["logprob_gap_vs_baseline"] < 1e-3, (method, res)
                assert math.isfinite(res["grad_norm"]), (method, res)
