"""The OpenEnv loop against the example grid server (examples/openenv/grid_env, started by the
loop's ``command`` as a real process) with a scripted policy: the episode's steps, their rewards
kept per turn and equal to the environment's own replay of the same actions, observations as
mask-0 deltas, a rejected action answered with the environment's message, a server that dies
mid-episode failing its sample alone and restarted, a server that never gets healthy named with
its log."""

from __future__ import annotations

import json
import sys

import pytest

from agentloop import AgentLoopContext, RolloutConfig
from agentloop.envs import OpenEnvAgentLoop
from agentloop.envs.openenv_client import OpenEnvSpec
from agentloop.envs.openenv_servers import OpenEnvServerError
from tests.unit.agentloop.scripted import ScriptedServer

pytestmark = pytest.mark.slow  # a real environment server per module (~5 s to start)

PROMPT = [{"role": "system", "content": "Walk to G. Call act with a move."}]
COMMAND = f"{sys.executable} -m examples.openenv.grid_env.server --port {{port}}"
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1}


def act(move: str) -> str:
    return f"<tool_call>\n{json.dumps({'name': 'act', 'arguments': {'move': move}})}\n</tool_call>"


def first_word_move(text: str) -> dict | None:
    """An ``openenv.action`` function: the turn's first word is the move."""
    words = text.split()
    return {"move": words[0].lower()} if words else None


@pytest.fixture(scope="module")
async def shared():
    """One context (so one server pool) for the module's loops; the pool closed at the end."""
    resources: dict = {}
    yield resources
    for pool in resources.values():
        await pool.close()


def make_loop(tokenizer, shared, turns, **openenv):
    server = ScriptedServer(tokenizer, turns)
    config = RolloutConfig(prompt_length=1024, response_length=1024)
    context = AgentLoopContext(server, tokenizer, config)
    context.resources = shared
    spec = {"command": COMMAND, "max_steps": 6, **openenv}
    return OpenEnvAgentLoop(context, openenv=spec), server


def replay(seed: int, moves: list[str]) -> list[float]:
    """The environment's own rewards for ``moves`` from ``reset(seed)`` (in process)."""
    from examples.openenv.grid_env.models import GridAction
    from examples.openenv.grid_env.server import GridEnvironment

    env = GridEnvironment()
    env.reset(seed=seed)
    return [float(env.step(GridAction(move=m)).reward) for m in moves]


def path_to_goal(seed: int) -> list[str]:
    from examples.openenv.grid_env.server import GridEnvironment

    env = GridEnvironment()
    env.reset(seed=seed)
    (r, c), (gr, gc) = env.state.agent, env.state.goal
    return ["down" if gr > r else "up"] * abs(gr - r) + ["right" if gc > c else "left"] * abs(
        gc - c
    )


async def test_episode_keeps_each_step_reward_on_its_turn_as_the_environment_scores_it(
    tokenizer, shared
):
    seed = 3
    moves = path_to_goal(seed)
    loop, server = make_loop(tokenizer, shared, [act(m) for m in moves])
    out = await loop.run(SAMPLING, raw_prompt=PROMPT, index=seed)

    record = out.record
    assert record.stop_reason == "done"
    assert [c.arguments for c in record.calls] == [{"move": m} for m in moves]
    assert record.turn_scores == pytest.approx(replay(seed, moves))
    assert sum(record.turn_scores) == pytest.approx(1.0 - 0.05 * (len(moves) - 1))
    assert out.reward_score == 0.0  # the return is the turn scores' sum
    assert len(record.turn_ends) == len(moves) and record.tool_errors == 0
    assert record.user_turns == len(moves) - 1  # no observation after the last move
    assert out.num_turns == 1 + len(moves) + len(moves) - 1
    # sampled turns are mask 1 and exactly what the engine returned; the rest is observation
    sampled = [t for t, m in zip(out.response_ids, out.response_mask, strict=True) if m]
    assert sampled == [t for ids in server.sampled for t in ids]
    observations = tokenizer.decode(
        [t for t, m in zip(out.response_ids, out.response_mask, strict=True) if not m]
    )
    assert observations.count("<tool_response>") == len(moves) - 1  # none after the last
    assert "board:\n" in observations and "message: Moved" in observations
    states = record.turn_states
    assert len(states) == len(moves) and len(set(states)) == len(moves)  # one per position


async def test_rejected_action_is_answered_with_the_environments_message_and_counted(
    tokenizer, shared
):
    loop, _ = make_loop(
        tokenizer,
        shared,
        ["diagonal", "up"],
        action="tests.unit.agentloop.envs.test_openenv_loop:first_word_move",
        max_steps=2,
    )
    out = await loop.run(SAMPLING, raw_prompt=PROMPT, index=1)

    assert out.record.tool_error_kinds == ["env_rejected"]
    assert [c.ok for c in out.record.calls] == [False, True]
    assert out.record.stop_reason == "max_steps"
    text = tokenizer.decode(out.response_ids)
    assert (
        "the environment rejected the action: Invalid message (VALIDATION_ERROR): move: "
        "Input should be 'up', 'down', 'left' or 'right'"
    ) in text


async def test_a_call_outside_the_action_schema_is_refused_before_the_environment(
    tokenizer, shared
):
    loop, _ = make_loop(tokenizer, shared, [act("diagonal"), "I stop here."])
    out = await loop.run(SAMPLING, raw_prompt=PROMPT, index=1)

    assert out.record.tool_error_kinds == ["schema"]
    assert out.record.calls == [] and out.record.stop_reason == "no_action"
    assert "diagonal" in tokenizer.decode(out.response_ids)


async def test_typed_client_class_and_a_function_action_run_the_same_game(tokenizer, shared):
    seed = 5
    moves = path_to_goal(seed)
    loop, _ = make_loop(
        tokenizer,
        shared,
        ["sideways please", *moves],
        client="examples.openenv.grid_env.client:GridEnv",
        action="tests.unit.agentloop.envs.test_openenv_loop:first_word_move",
    )
    out = await loop.run(SAMPLING, raw_prompt=PROMPT, index=seed)

    assert out.record.stop_reason == "done"
    # the typed action refuses "sideways" before it is sent: a rejected action, then the path
    assert out.record.tool_error_kinds == ["env_rejected"]
    assert out.record.turn_scores[1:] == pytest.approx(replay(seed, moves))
    assert "literal_error" in tokenizer.decode(out.response_ids) or "Input should be" in (
        tokenizer.decode(out.response_ids)
    )


async def test_a_server_that_dies_fails_its_sample_alone_and_is_restarted(tokenizer, shared):
    loop, server = make_loop(tokenizer, shared, [act("up"), act("up"), act("up")])
    pool = await loop._servers()
    victim = pool.servers[0]
    url = victim.url  # a restarted server gets a new port
    real_generate = server.generate

    async def kill_after_first(request):
        if len(server.sampled) == 1:
            victim.proc.kill()
            await victim.proc.wait()
        return await real_generate(request)

    server.generate = kill_after_first
    out = await loop.run(SAMPLING, raw_prompt=PROMPT, index=2)

    assert out.record.stop_reason == "env_error" and out.record.weight == 0.0
    assert out.record.error.startswith(f"the OpenEnv server at {url} closed the session")
    assert out.record.error.endswith("(the server was restarted)")
    assert victim.restarts == 1 and victim.proc.returncode is None
    again, _ = make_loop(tokenizer, shared, [act(m) for m in path_to_goal(4)])
    assert (await again.run(SAMPLING, raw_prompt=PROMPT, index=4)).record.stop_reason == "done"


async def test_a_refused_reset_fails_the_sample_alone(tokenizer, shared):
    loop, server = make_loop(tokenizer, shared, [act("up")], reset={"seed": [1, 2]})
    out = await loop.run(SAMPLING, raw_prompt=PROMPT, index=0)

    assert out.record.stop_reason == "env_error" and out.record.weight == 0.0
    assert "failed: OpenEnvServerError: reset was refused: " in out.record.error
    assert "(EXECUTION_ERROR)" in out.record.error
    assert server.sampled == []  # the policy never ran


def test_a_server_that_never_gets_healthy_is_a_start_up_error_with_its_log():
    command = f"{sys.executable} -c \"print('cannot serve on {{port}}'); raise SystemExit(2)\""
    spec = OpenEnvSpec.of({"command": command, "health_timeout_s": 20})
    with pytest.raises(OpenEnvServerError) as info:
        spec.probe()
    message = str(info.value)
    assert message.startswith("the OpenEnv server at http://127.0.0.1:")
    assert "did not answer its health check: its process exited with 2" in message
    assert "cannot serve on" in message.splitlines()[-1]


def test_bad_entries_say_what_to_change():
    with pytest.raises(ValueError, match="exactly one of url: http://... or command"):
        OpenEnvSpec.of({"servers": 2})
    with pytest.raises(ValueError, match=r"must name its port as \{port\}"):
        OpenEnvSpec.of({"command": "python serve.py"})
    with pytest.raises(ValueError, match=r"unknown keys \['moves'\]"):
        OpenEnvSpec.of({"url": "http://x", "moves": 3})


async def test_each_step_is_traced_with_its_action_and_reward(tokenizer, tmp_path, shared):
    import mlflow
    import yaml

    from agentloop import TraceContext
    from agentloop.config import AgentConfig, TraceConfig
    from agentloop.worker import AgentLoopWorker

    loops = tmp_path / "loops.yaml"
    entry = {"name": "grid", "_target_": "agentloop.envs.OpenEnvAgentLoop"}
    loops.write_text(yaml.safe_dump([{**entry, "openenv": {"command": COMMAND, "max_steps": 6}}]))
    store = f"sqlite:///{tmp_path / 'mlruns.db'}"
    config = RolloutConfig(
        prompt_length=1024,
        response_length=1024,
        trace=TraceConfig(backend="mlflow", tracking_uri=store, experiment_name="openenv"),
        agent=AgentConfig(default_agent_loop="grid", agent_loop_config_path=str(loops)),
    )
    moves = path_to_goal(6)
    server = ScriptedServer(tokenizer, [act(m) for m in moves])
    worker = AgentLoopWorker(config, server, tokenizer)
    worker.context.resources = dict(shared)  # the module's server; closing it is checked below
    previous = mlflow.get_tracking_uri()
    try:
        row = {"raw_prompt": PROMPT, "uid": "u1", "rollout_n": 0, "index": 6}
        (out,) = await worker.generate_sequences([row], None, TraceContext(step=1))
        worker.tracer.flush()
        spans = mlflow.get_trace(out.record.trace_id).data.spans
    finally:
        await worker.close_workspaces()  # closes what the worker's loops shared
        mlflow.set_tracking_uri(previous)
    steps = sorted((s for s in spans if s.name == "openenv.step"), key=lambda s: s.start_time_ns)
    assert [s.outputs["action"] for s in steps] == [{"move": m} for m in moves]
    assert [s.outputs["reward"] for s in steps] == pytest.approx(replay(6, moves))
    assert steps[-1].attributes["done"] == "True"
    assert worker.context.resources == {}
    (pool,) = shared.values()
    assert all(s.proc.returncode is not None for s in pool.servers)  # stopped with the worker


HEALTH_SERVER = """
import http.server, sys

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""

POOL_OWNER = """
import asyncio, sys
from agentloop.envs.openenv_servers import OpenEnvServers

async def main():
    pool = OpenEnvServers(command=sys.argv[1], servers=1)
    await pool.start()
    print(pool.servers[0].proc.pid, flush=True)
    await asyncio.sleep(300)

asyncio.run(main())
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" not in f.read()  # a zombie has exited
    except FileNotFoundError:
        return False


def test_a_command_server_ends_when_the_worker_that_started_it_dies(tmp_path):
    import os
    import signal
    import subprocess
    import time

    (tmp_path / "health.py").write_text(HEALTH_SERVER)
    command = f"{sys.executable} {tmp_path / 'health.py'} {{port}}"
    owner = subprocess.Popen(
        [sys.executable, "-c", POOL_OWNER, command], stdout=subprocess.PIPE, text=True
    )
    try:
        pid = int(owner.stdout.readline())
        assert _alive(pid)
        os.kill(owner.pid, signal.SIGKILL)  # no close(): the worker is gone
        owner.wait()
        deadline = time.monotonic() + 20
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(pid)
    finally:
        owner.kill()
