"""Tracing overhead (``make bench``): the same rollout batch with tracing off and on.

32 planned multi-turn trajectories (fixed token counts per turn, no tool latency, so the
rollout is pure generation and any tracing cost shows) on one vLLM CPU engine serving
tiny-qwen3, through an in-process AgentLoopWorker. Sides, each run twice after a warm-up,
alternating, best of two: off, on (every sample traced to a sqlite store), on with
token2text. The store export runs after a batch returns (in training it overlaps reward
and update); it is drained outside the timed rollout and reported on its own. Target
(printed): on / off <= 1.05. Writes bench_results/traces.json.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import mlflow
import pytest
import ray
import yaml

from agentloop import AgentConfig, RolloutConfig, TraceContext
from agentloop.config import TraceConfig
from agentloop.worker import AgentLoopWorker
from servers import ServerConfig, launch_servers
from tests.perf.bench_loops import make_plans
from tests.ray_local import init_local_ray
from trainer.models import prepare

REPO = Path(__file__).resolve().parents[2]
N = 32


@pytest.mark.slow
def test_bench_tracing_overhead(tmp_path):
    model = str(prepare("tiny-qwen3"))
    plans = make_plans(N, seed=0)
    rows = [
        {
            "raw_prompt": [{"role": "user", "content": f"Task {i}: look it up with the tool."}],
            "agent_name": "planned",
            "plan": plan,
        }
        for i, plan in enumerate(plans)
    ]
    loops = tmp_path / "loops.yaml"
    target = "tests.perf.bench_loops.PlannedToolLoop"
    loops.write_text(yaml.safe_dump([{"name": "planned", "_target_": target, "latency_scale": 0}]))
    store = f"sqlite:///{tmp_path / 'mlruns.db'}"
    previous = mlflow.get_tracking_uri()
    init_local_ray()
    try:
        (server,) = launch_servers(ServerConfig(model=model, max_model_len=2048), 1)

        def worker(trace: TraceConfig) -> AgentLoopWorker:
            config = RolloutConfig(
                prompt_length=256,
                response_length=1024,
                temperature=0.0,
                agent=AgentConfig(agent_loop_config_path=str(loops)),
                trace=trace,
            )
            return AgentLoopWorker(config, [server], model)

        sides = {
            "off": worker(TraceConfig()),
            "on": worker(TraceConfig(backend="mlflow", tracking_uri=store)),
            "on_token2text": worker(
                TraceConfig(backend="mlflow", tracking_uri=store, token2text=True)
            ),
        }

        drain: list[float] = []

        def run(name: str, step: int) -> float:
            start = time.perf_counter()
            asyncio.run(sides[name].generate_sequences(rows, None, TraceContext(step=step)))
            elapsed = time.perf_counter() - start
            tracer = sides[name].tracer
            if tracer is not None:  # the export, which in training overlaps reward + update
                start = time.perf_counter()
                tracer.flush()
                drain.append(time.perf_counter() - start)
            return elapsed

        for name in sides:  # warm-up (engine, prefix cache, store tables)
            run(name, 0)
        times: dict[str, list[float]] = {name: [] for name in sides}
        for step in (1, 2):
            for name in sides:
                times[name].append(run(name, step))
        flush_s = max(drain[-4:])
    finally:
        mlflow.set_tracking_uri(previous)
        if "server" in locals():
            ray.get(server.shutdown.remote())  # a killed engine leaves its /dev/shm segments
        ray.shutdown()
    best = {name: min(values) for name, values in times.items()}
    result = {
        "trajectories": N,
        **{f"{k}_s": v for k, v in best.items()},
        "ratio_on_off": best["on"] / best["off"],
        "ratio_token2text_off": best["on_token2text"] / best["off"],
        "flush_after_s": flush_s,
    }
    print(
        f"\ntracing overhead, {N} multi-turn trajectories on tiny-qwen3 (vLLM CPU), best of 2:\n"
        f"  off {best['off']:.2f} s | on {best['on']:.2f} s ({result['ratio_on_off']:.3f}x) | "
        f"on + token2text {best['on_token2text']:.2f} s ({result['ratio_token2text_off']:.3f}x)"
        f"\n  writing a batch's traces to the store after it returns (overlaps the trainer's "
        f"reward/update phases): up to {flush_s:.2f} s"
        "\n  target: on / off <= 1.05"
    )
    out = REPO / "bench_results"
    out.mkdir(exist_ok=True)
    (out / "traces.json").write_text(json.dumps(result, indent=1))
