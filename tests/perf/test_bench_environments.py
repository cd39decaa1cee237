"""Environments from the standards against the same environment written natively (``make
bench``): what the verifiers and OpenEnv paths cost around the model, on a scripted engine (no
model time; tiny-qwen3's tokenizer), both sides in the same run after a warm-up.

- verifiers: examples/verifiers/vf_calc.py (a ``ToolEnv`` with ``add`` and ``multiply``) by the
  ``verifiers`` loop (the worker's runner in verifiers' venv, the environment's rollout over the
  session gateway, its rubric) vs the same two functions as native tools under ``tool_agent``;
  each sample makes 3 model calls (multiply, add, answer). Prints seconds per sample and per
  model call, samples one after another, and the first sample (which starts the runner).
- OpenEnv: the grid server (examples/openenv/grid_env, one process) by the OpenEnv loop vs the
  same ``GridEnvironment`` in process as a native tool under ``tool_agent``; each episode is 10
  moves into a wall and a last turn with no move (11 model calls), 8 episodes at once, 3
  rounds. Prints environment steps per second.

Writes bench_results/environments.json. No target: the issue asks for the figures.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from agentloop import AgentLoopContext, RolloutConfig
from agentloop.envs import OpenEnvAgentLoop, VerifiersAgentLoop
from agentloop.envs.verifiers_env import VerifiersSpec, verifiers_python
from agentloop.tool_agent import ToolAgentLoop
from agentloop.tools import BaseTool, ToolResult
from agentloop.tools.function import FunctionTool
from tests.unit.agentloop.scripted import ScriptedServer

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = str(REPO / "examples" / "verifiers")
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1}
SAMPLES, EPISODES, ROUNDS, MOVES = 4, 8, 3, 10
GRID = f"{sys.executable} -m examples.openenv.grid_env.server --port {{port}}"


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def config(tmp: Path) -> RolloutConfig:
    c = RolloutConfig(prompt_length=2048, response_length=4096)
    c.gateway.log_dir = str(tmp / "gateway")
    return c


# ---- verifiers vs native tools --------------------------------------------------------------
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a * b


CALC_TURNS = [call("multiply", a=17, b=23), call("add", a=391, b=5), "The answer is 396."]


async def _verifiers_sample(
    tok: Any, tmp: Path, row: dict[str, Any], runners: dict[str, Any]
) -> float:
    server = ScriptedServer(tok, list(CALC_TURNS))
    context = AgentLoopContext(server, tok, config(tmp))
    context.resources = runners  # the worker's runner, started by the warm-up
    loop = VerifiersAgentLoop(context)
    start = time.perf_counter()
    out = await loop.run(SAMPLING, **row)
    seconds = time.perf_counter() - start
    assert "agent_error" not in out.extra and len(server.sampled) == 3, out.extra
    await loop.context.gateway.stop()
    return seconds


async def _native_sample(tok: Any, tmp: Path, prompt: list[dict[str, Any]]) -> float:
    server = ScriptedServer(tok, list(CALC_TURNS))
    tools = {"add": FunctionTool(add), "multiply": FunctionTool(multiply)}
    loop = ToolAgentLoop(AgentLoopContext(server, tok, config(tmp), tools))
    start = time.perf_counter()
    out = await loop.run(SAMPLING, raw_prompt=prompt)
    seconds = time.perf_counter() - start
    assert out.record.tool_calls == 2 and len(server.sampled) == 3
    return seconds


# ---- OpenEnv vs a native tool loop on the same game ---------------------------------------
class GridTool(BaseTool):
    """The grid game in process: one ``GridEnvironment`` per trajectory."""

    def __init__(self) -> None:
        schema = {
            "type": "function",
            "function": {
                "name": "act",
                "description": "Move the agent.",
                "parameters": {
                    "type": "object",
                    "properties": {"move": {"enum": ["up", "down", "left", "right"]}},
                    "required": ["move"],
                },
            },
        }
        super().__init__({}, schema)
        self.envs: dict[str, Any] = {}

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> str:
        from examples.openenv.grid_env.server import GridEnvironment

        env = self.envs[instance_id] = GridEnvironment()
        env.reset(seed=kwargs.get("seed", 0))
        return instance_id

    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> ToolResult:
        from examples.openenv.grid_env.models import GridAction

        obs = self.envs[instance_id].step(GridAction(**arguments))
        return ToolResult(f"board:\n{obs.board}\nmessage: {obs.message}", reward=obs.reward)

    async def release(self, instance_id: str) -> None:
        self.envs.pop(instance_id, None)


def _wall_move(seed: int) -> str:
    from examples.openenv.grid_env.server import GridEnvironment

    env = GridEnvironment()
    env.reset(seed=seed)
    return "up" if env.state.agent[0] == 0 else "down"


async def _grid_round(tok: Any, tmp: Path, native: bool, shared: dict[str, Any]) -> float:
    prompt = [{"role": "system", "content": "Walk to G. Call act with a move."}]
    tool = GridTool()

    async def episode(seed: int) -> int:
        turns = [call("act", move=_wall_move(seed))] * MOVES + ["I stop."]
        server = ScriptedServer(tok, turns)
        if native:
            context = AgentLoopContext(server, tok, config(tmp), {"act": tool})
            kwargs = {"act": {"create_kwargs": {"seed": seed}}}
            out = await ToolAgentLoop(context).run(SAMPLING, raw_prompt=prompt, tools_kwargs=kwargs)
        else:
            context = AgentLoopContext(server, tok, config(tmp))
            context.resources = shared
            spec = {"command": GRID, "max_steps": MOVES + 1}
            out = await OpenEnvAgentLoop(context, openenv=spec).run(
                SAMPLING, raw_prompt=prompt, index=seed
            )
        assert out.record.tool_calls == MOVES, out.record
        return MOVES

    start = time.perf_counter()
    steps = sum(await asyncio.gather(*(episode(s) for s in range(EPISODES))))
    return steps / (time.perf_counter() - start)


def test_bench_environment_paths_against_native(tiny_qwen3_path, tmp_path):
    tok = AutoTokenizer.from_pretrained(tiny_qwen3_path)
    result: dict[str, Any] = {}
    has_verifiers = Path(verifiers_python()).is_relative_to(REPO / ".venv-verifiers")
    if has_verifiers:
        spec = VerifiersSpec(env_id="vf-calc", env_args={"num_examples": 4}, paths=(EXAMPLES,))
        out = tmp_path / "rows.jsonl"
        spec.run("dataset", "--split", "eval", "--n", "1", "--out", str(out))
        row = json.loads(out.read_text().splitlines()[0])
        row["verifiers"] = {**spec.as_row_field(), "example": row["verifiers"]}
        prompt = row["raw_prompt"]

        async def calc() -> tuple[list[float], list[float], float]:
            runners: dict[str, Any] = {}
            try:  # warm-up, both sides; the first verifiers sample starts the runner
                first = await _verifiers_sample(tok, tmp_path, row, runners)
                await _native_sample(tok, tmp_path, prompt)
                vf, nat = [], []
                for _ in range(SAMPLES):  # alternating
                    vf.append(await _verifiers_sample(tok, tmp_path, row, runners))
                    nat.append(await _native_sample(tok, tmp_path, prompt))
                return vf, nat, first
            finally:
                for runner in runners.values():
                    await runner.close()

        vf, nat, first = asyncio.run(calc())
        result["verifiers"] = {
            "verifiers_first_sample_s": first,
            "verifiers_s_per_sample": statistics.median(vf),
            "native_s_per_sample": statistics.median(nat),
            "verifiers_s_per_call": statistics.median(vf) / 3,
            "native_s_per_call": statistics.median(nat) / 3,
        }
        r = result["verifiers"]
        print(
            f"\nverifiers vf-calc, 3 model calls a sample (median of {SAMPLES}): verifiers path "
            f"{r['verifiers_s_per_sample']:.3f} s/sample ({r['verifiers_s_per_call'] * 1e3:.1f} "
            f"ms/call) vs native tools {r['native_s_per_sample']:.3f} s/sample "
            f"({r['native_s_per_call'] * 1e3:.1f} ms/call): "
            f"{r['verifiers_s_per_sample'] / r['native_s_per_sample']:.1f}x; the worker's "
            f"first sample (starts the runner, loads the environment) {first:.2f} s"
        )
    else:
        print("\nverifiers: not installed (make verifiers), its side skipped")

    async def grid() -> dict[str, list[float]]:
        shared: dict[str, Any] = {}
        try:
            await _grid_round(tok, tmp_path, False, shared)  # warm-up: starts the server
            await _grid_round(tok, tmp_path, True, shared)
            rates: dict[str, list[float]] = {"openenv": [], "native": []}
            for _ in range(ROUNDS):
                rates["openenv"].append(await _grid_round(tok, tmp_path, False, shared))
                rates["native"].append(await _grid_round(tok, tmp_path, True, shared))
            return rates
        finally:
            for pool in shared.values():
                await pool.close()

    rates = asyncio.run(grid())
    result["openenv"] = {k: statistics.median(v) for k, v in rates.items()}
    o = result["openenv"]
    print(
        f"OpenEnv grid, {EPISODES} episodes of {MOVES} moves at once (median of {ROUNDS}): "
        f"OpenEnv path {o['openenv']:.0f} steps/s vs native tool loop {o['native']:.0f} "
        f"steps/s: {o['openenv'] / o['native']:.2f}x"
    )
    Path("bench_results").mkdir(exist_ok=True)
    Path("bench_results/environments.json").write_text(json.dumps(result, indent=2))
    assert o["openenv"] > 0 and o["native"] > 0
    if has_verifiers:
        assert result["verifiers"]["verifiers_s_per_sample"] > 0


@pytest.fixture(autouse=True)
def _quiet_gateway_logs(caplog):
    caplog.set_level("WARNING")
