"""Agent-loop benchmark (``make bench``): is tool latency hidden?

Seeded workload: 64 trajectories, 1-6 turns, 16-64 sampled tokens per turn, a tool between
turns with lognormal latency (median 1 s, sigma 1, capped at 20 s), one vLLM CPU engine
per model: tiny-qwen3 (fast engine: generation about equals the longest tool chain) and
smollm2-135m-instruct (generation-bound on CPU). Measured in one run after a warm-up:
- async: the agent loop through AgentLoopManager -> Ray AgentLoopWorker, one task per sample;
- turn-locked: every sample finishes a turn before any tool runs (batch-synchronous);
- lower bound: max(pure generation of the same tokens at full concurrency, i.e. the async
  loop with zero tool latency, and the longest per-trajectory tool chain).
- straggler-first: the async loop again on engines that schedule by the loops' priority
  (the sample held back most by turns and tools first), with the engine's default batch and
  with ``max_num_seqs`` capped (``BENCH_AGENT_CAPS``, default 16,8: turns then wait, so
  the priority order decides who runs, at some cost in throughput).
Targets (printed, not asserted): async >= 1.7x faster than turn-locked; async <= 1.15x the
lower bound. Writes bench_results/agent_loop.json. ``BENCH_AGENT_MODELS`` (comma-separated)
picks the models.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import replace
from pathlib import Path

import pytest
import ray
import yaml
from transformers import AutoTokenizer

from agentloop import AgentConfig, AgentLoopManager, RolloutConfig
from servers import AsyncLLMServerManager, ServerConfig, launch_servers
from tests.perf.bench_loops import make_plans, turn_locked
from tests.ray_local import init_local_ray
from trainer.models import prepare

N_TRAJ = 64


def _rows(plans):
    return [
        {
            "raw_prompt": [{"role": "user", "content": f"Task {i}: look it up with the tool."}],
            "agent_name": "planned",
            "plan": plan,
        }
        for i, plan in enumerate(plans)
    ]


MODELS = os.environ.get("BENCH_AGENT_MODELS", "tiny-qwen3,smollm2-135m-instruct").split(",")
CAPS = [int(c) for c in os.environ.get("BENCH_AGENT_CAPS", "16,8").split(",") if c]
RESULTS: dict[str, dict] = {}


@pytest.mark.parametrize("model_name", MODELS)
def test_bench_async_agent_loop_vs_turn_locked(tmp_path, model_name):
    model = str(prepare(model_name))
    plans = make_plans(N_TRAJ, seed=0)
    chain = max(sum(p["latency"]) for p in plans)
    tokens = sum(sum(p["tokens"]) for p in plans)
    init_local_ray()
    try:
        fcfs = ServerConfig(model=model, max_model_len=2048, scheduling_policy="fcfs")
        (server,) = launch_servers(fcfs, 1)
        results = {
            "model": Path(model).name,
            "trajectories": N_TRAJ,
            "sampled_tokens": tokens,
            "longest_tool_chain_s": chain,
        }
        loops = tmp_path / "loops.yaml"
        target = "tests.perf.bench_loops.PlannedToolLoop"

        def manager(scale: float, server=server) -> AgentLoopManager:
            loops.write_text(
                yaml.safe_dump([{"name": "planned", "_target_": target, "latency_scale": scale}])
            )
            config = RolloutConfig(
                prompt_length=256,
                response_length=1536,
                agent=AgentConfig(agent_loop_config_path=str(loops)),
            )
            return AgentLoopManager(config, [server], model)

        def timed_async(scale: float, rows, server=server, tag: str = "") -> float:
            m = manager(scale, server)
            start = time.perf_counter()
            batch = m.generate_sequences(rows)
            wall = time.perf_counter() - start
            assert int(batch.response_mask.sum()) == sum(sum(r["plan"]["tokens"]) for r in rows)
            m.shutdown()
            slowest = {k.split("/")[-1]: v for k, v in batch.metrics.items() if "/slowest/" in k}
            if tag != "_warmup":
                results[f"slowest_sample_latency_scale_{scale:g}{tag}"] = slowest
            return wall

        rows = _rows(plans)
        timed_async(0.0, _rows(make_plans(16, seed=1)), tag="_warmup")
        results["pure_generation_s"] = timed_async(0.0, rows)
        results["async_s"] = timed_async(1.0, rows)
        tokenizer = AutoTokenizer.from_pretrained(model)
        start = time.perf_counter()
        sampled = asyncio.run(turn_locked(AsyncLLMServerManager([server]), tokenizer, rows))
        results["turn_locked_s"] = time.perf_counter() - start
        assert sampled == tokens
        ray.get(server.shutdown.remote())
        ray.kill(server)  # frees its CPU for the next engine
        for cap in [None, *CAPS]:  # straggler-first: same workload, priority engines
            name = f"priority_cap_{cap}" if cap else "priority"
            config = replace(fcfs, scheduling_policy="priority", max_num_seqs=cap)
            (server,) = launch_servers(config, 1)
            timed_async(1.0, _rows(make_plans(16, seed=1)), server, "_warmup")
            results[f"async_{name}_s"] = timed_async(1.0, rows, server, f"_{name}")
            ray.get(server.shutdown.remote())
            ray.kill(server)
    finally:
        ray.shutdown()

    bound = max(results["pure_generation_s"], chain)
    results["lower_bound_s"] = bound
    results["speedup_vs_turn_locked"] = results["turn_locked_s"] / results["async_s"]
    results["async_over_lower_bound"] = results["async_s"] / bound
    straggler = "".join(
        f"  straggler-first {k[6:-2]:<17s}{v:6.1f} s = {v / bound:.2f}x the bound\n"
        for k, v in results.items()
        if k.startswith("async_priority")
    )
    print(
        f"\nagent loop, {N_TRAJ} trajectories, {tokens} sampled tokens, {results['model']}:\n"
        f"  async (AgentLoopManager, fcfs engine) {results['async_s']:7.1f} s\n"
        f"  turn-locked baseline      {results['turn_locked_s']:7.1f} s\n"
        f"  lower bound               {bound:7.1f} s  (pure generation "
        f"{results['pure_generation_s']:.1f} s, longest tool chain {chain:.1f} s)\n"
        f"  speedup vs turn-locked    {results['speedup_vs_turn_locked']:.2f}x  (target >= 1.7x)\n"
        f"  async / lower bound       {results['async_over_lower_bound']:.2f}x  (target <= 1.15x)\n"
        f"{straggler}"
    )
    RESULTS[results["model"]] = results
    out = Path("bench_results")
    out.mkdir(exist_ok=True)
    (out / "agent_loop.json").write_text(json.dumps(RESULTS, indent=2) + "\n")
