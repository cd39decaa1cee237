"""Coding-CLI harness benchmark (``make bench``): Claude Code and Codex, unmodified, one sample
each at a time on repo_fix tasks, in the bwrap sandbox and as plain processes, on one vLLM CPU
engine serving ``tiny-qwen3-long`` made to end its turns (tests/turn_ending_model.py: a turn
that never ends makes Claude Code retry and fail).

Per harness and sandbox, after one warm-up sample: the wall time of a sample (fresh workspace
copy, the CLI to its exit, the check), the CLI's start-up (from the sample's start to its first
model call), sessions, segments per session and their branch reasons, and token mismatches:
each engine call's prompt and sampled ids must be a prefix of its segment's ids (0 expected).
Writes bench_results/harness.json."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import pytest

from agentloop import AgentLoopContext, RolloutConfig
from agentloop.config import GatewayConfig
from agentloop.gateway import GatewayAgentLoop
from agentloop.gateway.harness import HarnessNotInstalled, HarnessSpec, resolve_binary
from agentloop.tools.sandbox import bwrap_problem
from recipes.repo_fix.make_tasks import make_tasks
from servers import AsyncLLMServerManager, ServerConfig, launch_servers
from tests.ray_local import init_local_ray
from tests.turn_ending_model import ending_anywhere_copy
from trainer.models import prepare

SAMPLES, WARMUP = 4, 1
HARNESSES = ("claude-code", "codex")


class _Recording:
    """The server manager, keeping each call's prompt ids, sampled ids and time."""

    def __init__(self, manager: AsyncLLMServerManager) -> None:
        self.manager = manager
        self.calls: list[tuple[float, list[int], list[int]]] = []

    async def generate(self, request: Any) -> Any:
        at = time.perf_counter()
        out = await self.manager.generate(request)
        self.calls.append((at, list(request.prompt_ids), list(out.token_ids)))
        return out


def _mismatches(calls: list[tuple[float, list[int], list[int]]], outs: list[Any]) -> int:
    """Engine calls whose prompt + sampled ids are not a prefix of any segment's ids."""
    segments = [list(o.prompt_ids) + list(o.response_ids) for o in outs]
    return sum(not any(seg[: len(p) + len(s)] == p + s for seg in segments) for _, p, s in calls)


async def _sample(
    context: AgentLoopContext, recorder: _Recording, spec: dict, row: dict
) -> dict[str, Any]:
    recorder.calls.clear()
    loop = GatewayAgentLoop(context, harness=spec)
    start = time.perf_counter()
    first = await loop.run(context.config.sampling_params(), **row)
    wall = time.perf_counter() - start
    outs = [first, *first.segments]
    return {
        "wall_s": wall,
        "startup_s": recorder.calls[0][0] - start if recorder.calls else None,
        "segments": len(outs),
        "reasons": [o.record.branch_reason for o in outs[1:]],
        "calls": len(recorder.calls),
        "mismatches": _mismatches(recorder.calls, outs),
        "error": first.extra.get("agent_error"),
        "reward": first.reward_score,
    }


async def _measure(model: Path, tasks: Path, logs: Path) -> dict[str, list[dict[str, Any]]]:
    from transformers import AutoTokenizer

    (server,) = launch_servers(ServerConfig(model=str(model), max_model_len=16384), 1)
    recorder = _Recording(AsyncLLMServerManager([server]))
    tokenizer = AutoTokenizer.from_pretrained(model)
    config = RolloutConfig(
        prompt_length=14336, response_length=64, gateway=GatewayConfig(log_dir=str(logs))
    )
    context = AgentLoopContext(recorder, tokenizer, config)
    rows = [json.loads(line) for line in (tasks / "val.jsonl").read_text().splitlines()]
    for r in rows:
        task = r["extra_info"]["workspace_task"]
        task["workspace"] = str(tasks / task["workspace"])
        r["raw_prompt"] = r.pop("prompt")
    results: dict[str, list[dict[str, Any]]] = {}
    try:
        for name in HARNESSES:
            for sandbox in ("bwrap", "process"):
                spec = {"name": name, "sandbox": sandbox, "timeout_s": 300}
                runs = [
                    await _sample(context, recorder, spec, rows[i % len(rows)])
                    for i in range(WARMUP + SAMPLES)
                ]
                results[f"{name}/{sandbox}"] = runs[WARMUP:]
    finally:
        await context.close_resources()
        if context.gateway is not None:
            await context.gateway.stop()
    return results


def test_bench_harness_samples_sandboxed_and_not(tmp_path):
    for name in HARNESSES:
        try:
            resolve_binary(HarnessSpec.of(name))
        except HarnessNotInstalled as e:
            pytest.skip(f"the harness CLIs are not installed (make harnesses needs npm): {e}")
    if (problem := bwrap_problem()) is not None:
        pytest.skip(f"bwrap cannot run here: {problem}")
    model = ending_anywhere_copy(prepare("tiny-qwen3-long"), tmp_path / "model")
    make_tasks(tmp_path / "tasks", train=0, val=4, seed=0)
    init_local_ray()
    results = asyncio.run(_measure(model, tmp_path / "tasks", tmp_path / "logs"))
    summary: dict[str, Any] = {}
    print(f"\nharness samples, {SAMPLES} each after {WARMUP} warm-up (tiny-qwen3-long, CPU):")
    for key, runs in results.items():
        walls = [r["wall_s"] for r in runs]
        starts = [r["startup_s"] for r in runs if r["startup_s"] is not None]
        reasons = sorted({x for r in runs for x in r["reasons"]})
        summary[key] = {
            "wall_s_p50": statistics.median(walls),
            "wall_s_max": max(walls),
            "startup_s_p50": statistics.median(starts) if starts else None,
            "sessions": len(runs),
            "segments_per_session": [r["segments"] for r in runs],
            "calls_per_session": [r["calls"] for r in runs],
            "branch_reasons": reasons,
            "mismatches": sum(r["mismatches"] for r in runs),
            "errors": [r["error"].splitlines()[-1] for r in runs if r["error"]],
        }
        s = summary[key]
        print(
            f"  {key:20s} sample p50 {s['wall_s_p50']:5.2f} s (max {s['wall_s_max']:5.2f})"
            f"  start-up p50 {s['startup_s_p50'] or float('nan'):5.2f} s"
            f"  segments {s['segments_per_session']} calls {s['calls_per_session']}"
            f"  mismatches {s['mismatches']}  errors {len(s['errors'])}"
            + (f"  reasons {reasons}" if reasons else "")
        )
    for name in HARNESSES:
        ratio = summary[f"{name}/bwrap"]["wall_s_p50"] / summary[f"{name}/process"]["wall_s_p50"]
        summary[f"{name}/sandbox_ratio_p50"] = ratio
        print(f"  {name}: sandboxed / unsandboxed sample p50 x{ratio:.2f}")
    out = Path("bench_results")
    out.mkdir(exist_ok=True)
    (out / "harness.json").write_text(json.dumps(summary, indent=2))
