"""LangGraph benchmark (``make bench``): what does running a sample as a LangGraph graph cost
next to the plain ``tool_agent`` loop?

Same workload both sides, one vLLM CPU engine (tiny-qwen3: fast generation, so framework
overhead is as visible as it gets on this machine), Ray AgentLoopWorkers: 64 samples, every
turn read as one echo tool call (20 ms latency), 4 model turns of 12 sampled tokens each.
Measured in one run after a warm-up of each side, alternating tool_agent / react_agent twice;
reported: rollout wall per side (best of two), the ratio, and the extra time per model turn.
Target (printed, not asserted): react_agent <= 1.10x tool_agent wall.
Writes bench_results/langgraph.json.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import ray
import yaml

from agentloop import AgentConfig, AgentLoopManager, MultiTurnConfig, RolloutConfig
from servers import ServerConfig, launch_servers
from tests.integration.agentloop.helpers import ECHO_SCHEMA
from tests.ray_local import init_local_ray
from trainer.models import prepare

N, TURNS, TOKENS = 64, 4, 12
LOOPS = {
    "tool_agent": "tests.integration.agentloop.helpers.CappedTurnsToolAgentLoop",
    "react_agent": "tests.integration.agentloop.helpers.CappedTurnsReactAgentLoop",
}


def test_bench_react_agent_vs_tool_agent(tmp_path):
    model = str(prepare("tiny-qwen3"))
    tool = {
        "class_name": "tests.integration.agentloop.helpers.EchoTool",
        "config": {"type": "native", "latency_s": 0.02},
        "tool_schema": ECHO_SCHEMA,
    }
    (tmp_path / "tools.yaml").write_text(yaml.safe_dump({"tools": [tool]}))
    loops = [{"name": name, "_target_": target} for name, target in LOOPS.items()]
    (tmp_path / "loops.yaml").write_text(yaml.safe_dump(loops))
    config = RolloutConfig(
        prompt_length=384,
        response_length=TURNS * (TOKENS + 48),
        multi_turn=MultiTurnConfig(
            max_assistant_turns=TURNS,
            max_tokens_per_turn=TOKENS,
            tool_config_path=str(tmp_path / "tools.yaml"),
        ),
        agent=AgentConfig(num_workers=1, agent_loop_config_path=str(tmp_path / "loops.yaml")),
        chat_template_kwargs={"enable_thinking": False},
    )

    def rows(name: str, n: int) -> list[dict]:
        return [
            {"raw_prompt": [{"role": "user", "content": f"Echo item {i}."}], "agent_name": name}
            for i in range(n)
        ]

    init_local_ray()
    walls: dict[str, list[float]] = {name: [] for name in LOOPS}
    turns: dict[str, int] = {}
    try:
        (server,) = launch_servers(ServerConfig(model=model, max_model_len=1024), 1)
        manager = AgentLoopManager(config, [server], model)
        for name in LOOPS:  # warm-up: imports, graph compile, prefix cache
            manager.generate_sequences(rows(name, 8))
        for _ in range(2):
            for name in LOOPS:
                start = time.perf_counter()
                batch = manager.generate_sequences(rows(name, N))
                walls[name].append(time.perf_counter() - start)
                turns[name] = sum(r.assistant_turns for r in batch.records)
        manager.shutdown()
        ray.get(server.shutdown.remote())
    finally:
        ray.shutdown()

    best = {name: min(w) for name, w in walls.items()}
    ratio = best["react_agent"] / best["tool_agent"]
    per_turn_ms = 1000 * (best["react_agent"] - best["tool_agent"]) / turns["react_agent"]
    results = {
        "samples": N,
        "model_turns": turns,
        "walls_s": walls,
        "best_s": best,
        "ratio": ratio,
        "extra_ms_per_turn": per_turn_ms,
    }
    print(
        f"\nLangGraph react_agent vs tool_agent, {N} samples, tiny-qwen3, 1 worker:\n"
        f"  tool_agent   {best['tool_agent']:6.2f} s  ({turns['tool_agent']} model turns)\n"
        f"  react_agent  {best['react_agent']:6.2f} s  ({turns['react_agent']} model turns)\n"
        f"  ratio        {ratio:.3f}x  (target <= 1.10x)\n"
        f"  extra        {per_turn_ms:.2f} ms per model turn (wall, 64 samples concurrent)"
    )
    assert turns["react_agent"] == turns["tool_agent"] == N * TURNS
    out = Path("bench_results")
    out.mkdir(exist_ok=True)
    (out / "langgraph.json").write_text(json.dumps(results, indent=2) + "\n")
