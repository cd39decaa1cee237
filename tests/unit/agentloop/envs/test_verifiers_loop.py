"""verifiers environments (examples/verifiers, written in verifiers' own classic API) run by the
``verifiers`` loop in their own interpreter (``make verifiers``), against the real session gateway
on a scripted policy: a tool environment and a multi-turn environment each score the session as
their own evaluation scores the same completion, each rubric function kept as a reward part and
the environment's state as metrics; every model call is a token-exact gateway call. An
environment id that is not installed is a start-up error naming the id and the install command.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agentloop import AgentLoopContext, RolloutConfig
from agentloop.base import load_agent_loop_config
from agentloop.envs import VerifiersAgentLoop
from agentloop.envs.verifiers_env import VerifiersSpec, verifiers_python
from tests.unit.agentloop.scripted import ScriptedServer

REPO = Path(__file__).resolve().parents[4]
EXAMPLES = str(REPO / "examples" / "verifiers")
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1}

pytestmark = [
    pytest.mark.slow,  # a verifiers process per sample (~5 s of imports)
    pytest.mark.skipif(
        not Path(verifiers_python()).is_relative_to(REPO / ".venv-verifiers")
        and "AGENTLOOP_VERIFIERS_PYTHON" not in os.environ,
        reason="verifiers is not installed: `make verifiers` makes .venv-verifiers",
    ),
]


def spec(env_id: str, **env_args) -> VerifiersSpec:
    return VerifiersSpec(env_id=env_id, env_args=env_args, paths=(EXAMPLES,))


def env_rows(tmp_path: Path, s: VerifiersSpec, n: int) -> list[dict]:
    out = tmp_path / f"{s.env_id}.jsonl"
    s.run("dataset", "--split", "eval", "--n", str(n), "--out", str(out))
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return [
        {**r, "index": i, "verifiers": {**s.as_row_field(), "example": r["verifiers"]}}
        for i, r in enumerate(rows)
    ]


CALC = spec("vf-calc", num_examples=8)
GUESS = spec("vf-guess", num_examples=8, max_turns=5)


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> dict[str, list[dict]]:
    """Two rows of each environment's eval split, made once (a runner process each)."""
    tmp = tmp_path_factory.mktemp("rows")
    return {s.env_id: env_rows(tmp, s, 2) for s in (CALC, GUESS)}


@pytest.fixture(scope="module")
async def runners():
    """The module's samples share runners, as a worker's do; closed at the end."""
    resources: dict = {}
    yield resources
    for runner in resources.values():
        await runner.close()


def call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


async def run_row(tokenizer, tmp_path, row: dict, turns: list[str], resources=None):
    """One sample on a scripted engine; the runner is closed after it unless ``resources``
    (a worker's, shared across samples) is given."""
    server = ScriptedServer(tokenizer, turns)
    config = RolloutConfig(prompt_length=1024, response_length=1024)
    config.gateway.log_dir = str(tmp_path / "gateway")
    context = AgentLoopContext(server, tokenizer, config)
    if resources is not None:
        context.resources = resources
    loop = VerifiersAgentLoop(context)
    try:
        out = await loop.run(SAMPLING, **row)
    finally:
        if resources is None:
            for runner in context.resources.values():
                await runner.close()
    return loop, out, server


def own_score(s: VerifiersSpec, tmp_path: Path, row: dict, result: dict) -> dict:
    """The environment's own evaluation of the completion the session produced."""
    given = tmp_path / "score_in.json"
    given.write_text(json.dumps({"row": row, "completion": result["completion"]}))
    return json.loads(s.run("score", "--in", str(given)))


async def test_tool_environment_scores_the_session_as_its_own_evaluation(
    tokenizer, tmp_path, rows, runners
):
    s, row = CALC, rows["vf-calc"][0]
    truth = row["reward_model"]["ground_truth"]
    turns = [call("multiply", a=2, b=3), f"The answer is {truth}."]
    loop, out, server = await run_row(tokenizer, tmp_path, row, turns, runners)

    assert "agent_error" not in out.extra, out.extra.get("agent_error")
    result = json.loads(
        (tmp_path / "gateway" / loop.session.id / "verifiers_result.json").read_text()
    )
    own = own_score(s, tmp_path, row, result)
    assert out.reward_score == pytest.approx(own["reward"]) == pytest.approx(1.2)
    assert out.record.reward_parts == pytest.approx(own["scores"])
    assert out.record.reward_parts["correct_answer"] == 1.0
    assert out.record.reward_parts["used_tools"] == 1.0
    assert out.metrics["env/turns"] == 2 and out.metrics["env/tool_calls"] == 1
    # both calls went through the gateway: the sampled ids, in order, mask 1
    sampled = [t for t, m in zip(out.response_ids, out.response_mask, strict=True) if m]
    assert sampled == [t for ids in server.sampled for t in ids]
    assert out.record.assistant_turns == 2


async def test_multi_turn_environment_replies_until_solved(tokenizer, tmp_path, rows, runners):
    row = rows["vf-guess"][0]
    secret = int(row["reward_model"]["ground_truth"])
    low, high, guesses = 1, 16, []
    while True:  # binary search, the env's "higher"/"lower" replies are scripted ahead
        guess = (low + high) // 2
        guesses.append(guess)
        if guess == secret:
            break
        low, high = (guess + 1, high) if guess < secret else (low, guess - 1)
    _, out, _ = await run_row(tokenizer, tmp_path, row, [str(g) for g in guesses], runners)

    assert "agent_error" not in out.extra, out.extra.get("agent_error")
    assert out.record.reward_parts["solved"] == 1.0
    efficiency = (5 - len(guesses) + 1) / 5
    assert out.reward_score == pytest.approx(1.0 + 0.5 * efficiency)
    assert out.metrics["env/turns"] == len(guesses)
    assert out.record.assistant_turns == len(guesses) and out.record.user_turns == len(guesses) - 1


async def test_a_runner_that_dies_fails_its_sample_alone_and_starts_again(
    tokenizer, tmp_path, rows
):
    guess = rows["vf-guess"]
    resources: dict = {}
    try:
        _, warm, _ = await run_row(tokenizer, tmp_path, guess[0], ["1", "2", "3"], resources)
        assert "agent_error" not in warm.extra
        (runner,) = resources.values()

        class Killing(ScriptedServer):
            async def generate(self, request):  # the runner dies during the session's call
                runner._proc.kill()
                await runner._proc.wait()
                return await super().generate(request)

        server = Killing(tokenizer, ["4"])
        config = RolloutConfig(prompt_length=1024, response_length=1024)
        config.gateway.log_dir = str(tmp_path / "gateway")
        context = AgentLoopContext(server, tokenizer, config)
        context.resources = resources
        out = await VerifiersAgentLoop(context).run(SAMPLING, **guess[1])
        assert out.record.stop_reason == "agent_error"
        assert (
            "verifiers environment 'vf-guess': the verifiers runner exited with -9"
            in (out.extra["agent_error"])
        )
        _, again, _ = await run_row(tokenizer, tmp_path, guess[1], ["5", "6", "7"], resources)
        assert "agent_error" not in again.extra and runner.starts == 2
    finally:
        for r in resources.values():
            await r.close()


def test_an_environment_that_is_not_installed_is_a_start_up_error(tmp_path):
    entry = [
        {"name": "vf", "_target_": "agentloop.envs.VerifiersAgentLoop", "verifiers": "vf-nope"}
    ]
    path = tmp_path / "loops.yaml"
    path.write_text(json.dumps(entry))
    load_agent_loop_config(path)  # checked for form only: the workers do not probe
    with pytest.raises(ValueError) as info:
        load_agent_loop_config(path, probe=True)
    message = str(info.value)
    python = verifiers_python()
    assert message.startswith(
        f"{path}: agent loop 'vf': verifiers environment 'vf-nope' is not installed in {python}: "
        f"install it with `{python} -m pip install vf-nope`"
    )


async def test_the_rubric_and_state_are_in_the_sample_trace(tokenizer, tmp_path, rows, runners):
    import mlflow

    from agentloop import TraceContext
    from agentloop.config import AgentConfig, TraceConfig
    from agentloop.worker import AgentLoopWorker

    row = rows["vf-calc"][1]
    truth = row["reward_model"]["ground_truth"]
    store = f"sqlite:///{tmp_path / 'mlruns.db'}"
    config = RolloutConfig(
        prompt_length=1024,
        response_length=1024,
        trace=TraceConfig(backend="mlflow", tracking_uri=store, experiment_name="verifiers"),
        agent=AgentConfig(default_agent_loop="verifiers"),
    )
    config.gateway.log_dir = str(tmp_path / "gateway")
    server = ScriptedServer(tokenizer, [f"It is {truth}."])
    worker = AgentLoopWorker(config, server, tokenizer)
    worker.context.resources = runners  # the module's runner (closed by its fixture)
    previous = mlflow.get_tracking_uri()
    try:
        (out,) = await worker.generate_sequences([{**row, "uid": "u"}], None, TraceContext(step=1))
        worker.tracer.flush()
        spans = mlflow.get_trace(out.record.trace_id).data.spans
    finally:
        await worker.context.gateway.stop()
        mlflow.set_tracking_uri(previous)
    (env,) = [x for x in spans if x.name == "verifiers:vf-calc"]
    assert env.outputs["reward"] == pytest.approx(1.0)  # right answer, no tool used
    assert env.outputs["scores"]["correct_answer"] == 1.0
    assert env.outputs["scores"]["used_tools"] == 0.0
    assert env.outputs["weights"]["used_tools"] == 0.2
    assert env.attributes["turns"] == "1.0" and env.attributes["tool_calls"] == "0.0"
