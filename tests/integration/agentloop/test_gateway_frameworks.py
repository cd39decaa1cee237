"""The example agents of ``examples/gateway/`` on a real vLLM CPU engine (tiny-qwen3, the
session's shared server): each framework's agent runs a scored rollout through the real
gateway, in this process over the server manager, with the unit tests' exactness checks on
the engine's own outputs (every request its segment's trajectory so far, the sampled ids and
engine log-probs kept in order, prompts the full render of each segment's first messages);
then all five through Ray AgentLoopWorkers from ``examples/gateway/agents.yaml``."""

from __future__ import annotations

import pytest
import yaml
from transformers import AutoTokenizer

from agentloop import AgentConfig, AgentLoopContext, AgentLoopManager, RolloutConfig
from agentloop.gateway import GatewayAgentLoop
from agentloop.tokens import encode_prompt
from examples.gateway.calc_tools import TOOLS
from examples.gateway.data import gateway_rows
from servers import AsyncLLMServerManager
from tests.integration.agentloop.helpers import max_logprob_gap
from tests.unit.agentloop.gateway.test_frameworks import check_exact

pytestmark = pytest.mark.integration

# the shared server is 512 tokens long: a prompt with both tools is ~290 of them
PROMPT_LEN, RESPONSE_LEN = 416, 96
SMOL_SYSTEM = "Solve the task with the tools; answer with final_answer.\n{{custom_instructions}}"
AGENTS = {
    "openai_sdk_agent": {},
    "agents_sdk_agent": {},
    "langgraph_agent": {},
    # smolagents' own system prompt is ~950 tokens: a short one, and one step
    "smolagents_agent": {"max_steps": 1, "system_prompt": SMOL_SYSTEM},
    "summarizing_agent": {"summarize_after": 1},
}


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen3_path):
    return AutoTokenizer.from_pretrained(tiny_qwen3_path)


def config(**agent) -> RolloutConfig:
    return RolloutConfig(
        prompt_length=PROMPT_LEN, response_length=RESPONSE_LEN, agent=AgentConfig(**agent)
    )


class RecordingClient:
    """The server manager, keeping each request's prompt ids and what the engine returned."""

    def __init__(self, manager: AsyncLLMServerManager) -> None:
        self.manager = manager
        self.calls: list[tuple[list[int], list[int], list[float]]] = []

    async def generate(self, request):
        out = await self.manager.generate(request)
        self.calls.append(
            (list(request.prompt_ids), list(out.token_ids), list(out.log_probs or []))
        )
        return out


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("name", list(AGENTS))
async def test_each_framework_agent_scores_an_exact_session_on_the_engine(
    tiny_server, tokenizer, name
):
    (row,) = gateway_rows(1, seed=3, split="val", agent=f"gateway_{name}")
    row["raw_prompt"] = row.pop("prompt")
    client = RecordingClient(AsyncLLMServerManager([tiny_server]))
    context = AgentLoopContext(client, tokenizer, config())
    loop = GatewayAgentLoop(context, agent=f"examples.gateway.{name}:agent", **AGENTS[name])
    try:
        out = await loop.run(context.config.sampling_params(), **row)
    finally:
        await context.gateway.stop()

    assert "agent_error" not in out.extra, out.extra.get("agent_error")
    assert out.reward_score in (0.0, 1.0)  # the agent's score of its answer
    session = loop.session
    assert session.calls == len(client.calls) >= 1
    check_exact(out, client.calls, session, tokenizer, {})
    first = session.segments[0]
    assert first.prompt_messages[-1]["content"] in (
        row["raw_prompt"][-1]["content"],
        "New task:\n" + row["raw_prompt"][-1]["content"],  # smolagents
        [{"type": "text", "text": "New task:\n" + row["raw_prompt"][-1]["content"]}],
    )
    if name in ("openai_sdk_agent", "summarizing_agent"):
        assert out.prompt_ids == encode_prompt(tokenizer, row["raw_prompt"], tools=TOOLS)
    weights = [o.record.weight for o in (out, *out.segments)]
    assert weights == [1 / len(weights)] * len(weights)


def test_the_agents_yaml_runs_every_framework_in_ray_workers(
    tiny_server, tokenizer, tiny_qwen3_path, tmp_path
):
    loops = yaml.safe_load(open("examples/gateway/agents.yaml"))
    for entry in loops:
        entry.update(AGENTS[entry["agent"].split(".")[-1].split(":")[0]])
    (tmp_path / "agents.yaml").write_text(yaml.safe_dump(loops))
    rows = [
        {**row, "raw_prompt": row.pop("prompt")}
        for i, entry in enumerate(loops)
        for row in gateway_rows(1, seed=10 + i, split="val", agent=entry["name"])
    ]
    cfg = config(num_workers=2, agent_loop_config_path=str(tmp_path / "agents.yaml"))
    manager = AgentLoopManager(cfg, [tiny_server], str(tiny_qwen3_path))
    try:
        manager.validate(rows)
        batch = manager.generate_sequences(rows, sampling_params=cfg.sampling_params())
    finally:
        manager.shutdown()

    names = [entry["name"] for entry in loops]
    assert set(batch.agent_name) == set(names)
    sessions: dict[str, float] = {}
    for record in batch.records:
        assert record.session_id and record.stop_reason != "agent_error"
        sessions[record.session_id] = sessions.get(record.session_id, 0.0) + record.weight
    # one session per row; its segments (smolagents: one per call) weigh one session together
    assert len(sessions) == len(rows) and all(w == pytest.approx(1.0) for w in sessions.values())
    assert all(score in (0.0, 1.0) for score in batch.reward_score)
    assert max_logprob_gap(batch, tiny_qwen3_path, PROMPT_LEN) < 1e-3
