"""The agent-loop benchmark workload: a seeded plan of turns (sampled tokens per turn) and
tool latencies, run (a) by a registered agent loop through AgentLoopManager, one asyncio task
per trajectory, and (b) turn-locked, as batch-synchronous frameworks do."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import numpy as np

from agentloop import AgentLoopBase, AgentLoopOutput
from agentloop.tokens import Trajectory, encode_delta, encode_prompt
from servers.types import GenerateRequest

TOOL_TEXT = "result: 42"
ASSISTANT_TEXT = '<tool_call>\n{"name": "lookup", "arguments": {"q": "x"}}\n</tool_call>'


def make_plans(
    n: int, seed: int = 0, *, sigma: float = 1.0, cap_s: float = 20.0
) -> list[dict[str, Any]]:
    """``n`` trajectories: 1-6 turns, 16-64 sampled tokens per turn, one tool call between
    consecutive turns with lognormal latency (median 1 s, ``sigma``, capped at ``cap_s``)."""
    rng = np.random.default_rng(seed)
    plans = []
    for _ in range(n):
        turns = int(rng.integers(1, 7))
        tokens = rng.integers(16, 65, size=turns).tolist()
        latency = np.minimum(rng.lognormal(0.0, sigma, size=turns - 1), cap_s).tolist()
        plans.append({"tokens": tokens, "latency": latency})
    return plans


def params(tokens: int) -> dict[str, Any]:
    return {"temperature": 1.0, "max_tokens": tokens, "ignore_eos": True}


class PlannedToolLoop(AgentLoopBase):
    """Follows ``plan``: each turn samples exactly the planned tokens; between turns a tool
    waits its planned latency (``latency_scale`` 0 gives pure generation) and its message is
    appended as a chat-template delta, as tool_agent does."""

    def __init__(self, context, latency_scale: float = 1.0, **kwargs) -> None:
        super().__init__(context, **kwargs)
        self.latency_scale = latency_scale

    async def run(self, sampling_params, *, raw_prompt, plan, **row) -> AgentLoopOutput:
        messages = list(raw_prompt)
        traj = Trajectory(await self.encode_prompt(messages), self.config.response_length)
        rid = uuid.uuid4().hex
        for k, tokens in enumerate(plan["tokens"]):
            await self.generate(rid, traj, params(tokens))
            if k == len(plan["tokens"]) - 1:
                break
            start = time.perf_counter()
            await asyncio.sleep(plan["latency"][k] * self.latency_scale)
            self.metrics["tool_s"] += time.perf_counter() - start
            messages.append({"role": "assistant", "content": ASSISTANT_TEXT})
            new = [{"role": "tool", "content": TOOL_TEXT}]
            traj.add_template(await self.encode_delta(messages, new))
            messages.extend(new)
        return self.output(traj, num_turns=2 * len(plan["tokens"]))


async def turn_locked(server: Any, tokenizer: Any, rows: list[dict[str, Any]]) -> int:
    """Every trajectory finishes turn k before any tool runs; the turn's tools run together;
    then turn k+1. Returns sampled tokens."""
    messages = [list(r["raw_prompt"]) for r in rows]
    contexts = [encode_prompt(tokenizer, m) for m in messages]
    rids = [uuid.uuid4().hex for _ in rows]
    sampled = 0
    for k in range(max(len(r["plan"]["tokens"]) for r in rows)):
        active = [i for i, r in enumerate(rows) if k < len(r["plan"]["tokens"])]
        outs = await asyncio.gather(
            *(
                server.generate(
                    GenerateRequest(
                        prompt_ids=contexts[i],
                        sampling_params=params(rows[i]["plan"]["tokens"][k]),
                        session_id=rids[i],
                    )
                )
                for i in active
            )
        )
        for i, out in zip(active, outs, strict=True):
            contexts[i] = contexts[i] + out.token_ids
            sampled += len(out.token_ids)
        calling = [i for i in active if k < len(rows[i]["plan"]["latency"])]
        await asyncio.gather(*(asyncio.sleep(rows[i]["plan"]["latency"][k]) for i in calling))
        deltas = await asyncio.gather(
            *(
                asyncio.to_thread(
                    encode_delta,
                    tokenizer,
                    [*messages[i], {"role": "assistant", "content": ASSISTANT_TEXT}],
                    [{"role": "tool", "content": TOOL_TEXT}],
                )
                for i in calling
            )
        )
        for i, delta in zip(calling, deltas, strict=True):
            messages[i] += [
                {"role": "assistant", "content": ASSISTANT_TEXT},
                {"role": "tool", "content": TOOL_TEXT},
            ]
            contexts[i] = contexts[i] + delta
    return sampled
