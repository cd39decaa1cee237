"""Loops and tools the integration tests load by dotted path into Ray workers (the tests put
the repo root on the workers' PYTHONPATH)."""

from __future__ import annotations

import asyncio

from agentloop.langgraph import ReactAgentLoop
from agentloop.parsers import ParsedTurn, ToolCall
from agentloop.tool_agent import ToolAgentLoop
from agentloop.tools import BaseTool, ToolResult
from servers.types import TokenOutput

ECHO_SCHEMA = {
    "type": "function",
    "function": {
        "name": "echo",
        "description": "Repeat a text back with its length.",
        "parameters": {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
    },
}


class EchoTool(BaseTool):
    """Answers ``<prefix>echo(<n> chars)``; ``prefix`` comes from the row's create_kwargs."""

    schema = ECHO_SCHEMA

    def __init__(self, config=None, tool_schema=None) -> None:
        super().__init__(config, tool_schema)
        self.prefixes: dict[str, str] = {}

    async def create(self, instance_id=None, **create_kwargs):
        self.prefixes[instance_id] = create_kwargs.get("prefix", "")
        return instance_id

    async def execute(self, instance_id, arguments):
        await asyncio.sleep(float(self.config.get("latency_s", 0.05)))
        return ToolResult(f"{self.prefixes[instance_id]}echo({len(arguments['text'])} chars)")

    async def release(self, instance_id):
        self.prefixes.pop(instance_id, None)


class EveryTurnCallsParser:
    """Reads every model turn as one ``echo`` call of its text: a small model that never
    writes tool calls still exercises the multi-turn tool path on a real engine."""

    def parse(self, text: str) -> ParsedTurn:
        return ParsedTurn(content=text, items=[ToolCall("echo", {"text": text}, raw=text)])


class ForcedToolAgentLoop(ToolAgentLoop):
    """tool_agent whose parser finds an echo call in every turn."""

    def __init__(self, context, **kwargs) -> None:
        super().__init__(context, **kwargs)
        self.parser = EveryTurnCallsParser()
        self.tag = kwargs.get("tag")


class ClosesCutTurns:
    """Mixin for a random tiny model, which almost never samples the end-of-turn token: a
    turn cut by ``multi_turn.max_tokens_per_turn`` is closed with an end-of-turn token
    appended as template text (mask 0, never trained on), so rollouts are multi-turn while
    every sampled token keeps the engine's own log-prob."""

    async def generate(self, session_id, traj, sampling_params):
        out = await super().generate(session_id, traj, sampling_params)
        eot = self.tokenizer.convert_tokens_to_ids(self.tokenizer.eos_token)
        if out.finish_reason == "length" and out.token_ids and traj.add_template([eot]):
            return TokenOutput([*out.token_ids, eot], None, "stop")
        return out


class CappedTurnsToolAgentLoop(ClosesCutTurns, ForcedToolAgentLoop):
    """ForcedToolAgentLoop whose cut turns are closed (see ``ClosesCutTurns``)."""


class CappedTurnsReactAgentLoop(ClosesCutTurns, ReactAgentLoop):
    """react_agent (LangGraph) that reads every turn as an echo call, cut turns closed."""

    parser = EveryTurnCallsParser()


def max_logprob_gap(batch, model_path, prompt_len: int) -> float:
    """Largest |engine - transformers| log-prob over every sampled (mask 1) token of a
    ``RolloutBatch``, the transformers side a float32 forward over each whole trajectory."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32)
    model.eval()
    worst = 0.0
    for i in range(len(batch)):
        attn = batch.attention_mask[i].bool()
        ids = batch.input_ids[i][attn].unsqueeze(0)
        n_prompt = int(attn[:prompt_len].sum())
        with torch.no_grad():
            logits = model(ids).logits[0, :-1].float()
        logp = torch.log_softmax(logits, -1).gather(1, ids[0, 1:].unsqueeze(1)).squeeze(1)
        resp = logp[n_prompt - 1 :]
        mask = batch.response_mask[i, : resp.shape[0]].bool()
        gap = (resp[mask] - batch.rollout_log_probs[i, : resp.shape[0]][mask]).abs().max()
        worst = max(worst, gap.item())
    return worst


def max_line_logprob_gap(lines: list[dict], model_path) -> float:
    """Largest |engine - transformers| log-prob over the sampled (mask 1) tokens of
    ``agentloop-rollout`` lines; logits of the response positions only (a long prompt times
    the vocabulary would not fit)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    worst = 0.0
    for r in lines:
        ids = torch.tensor([r["prompt_ids"] + r["response_ids"]])
        with torch.no_grad():
            hidden = model.model(ids).last_hidden_state[0, len(r["prompt_ids"]) - 1 : -1]
            logits = model.lm_head(hidden)
        chosen = torch.tensor(r["response_ids"]).unsqueeze(1)
        ours = torch.log_softmax(logits.float(), -1).gather(1, chosen).squeeze(1)
        mask = torch.tensor(r["response_mask"]).bool()
        engine = torch.tensor(r["response_log_probs"])
        worst = max(worst, (ours[mask] - engine[mask]).abs().max().item())
    return worst


class CallsNodeParser:
    """Reads every model turn as one call of the MCP tool ``where-node``
    (tests/integration/cluster/node_mcp_server.py)."""

    def parse(self, text: str) -> ParsedTurn:
        return ParsedTurn(content=text, items=[ToolCall("where-node", {}, raw=text)])


class NodeToolAgentLoop(ClosesCutTurns, ToolAgentLoop):
    """tool_agent that calls ``where-node`` every turn, cut turns closed."""

    def __init__(self, context, **kwargs) -> None:
        super().__init__(context, **kwargs)
        self.parser = CallsNodeParser()
