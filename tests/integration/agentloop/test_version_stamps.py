"""Version stamps end to end (issue 38): a weight push lands in the middle of a multi-turn
tool session. The agent (the ``openai`` SDK through the session gateway, a text agent that
hands the model its tool's observation as a user message) sends a turn, its tool runs while
the trainer side pauses the servers, pushes new weights and resumes, then the agent sends the
observation for the model's next turn. In the training batch the session
makes, each sampled token carries the version that sampled it (the tool's tokens none), and
the trainer's own log-prob pass over that batch, with the weights of each stamped version,
gives the engine's stored log-probs. The shared tiny-qwen3 server gets its weights back."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentloop import AgentLoopContext, RolloutConfig, collate
from agentloop.gateway import GatewayAgentLoop
from servers import AsyncLLMServerManager
from tests.weight_updates import load_named
from trainer.workers import TrainBatch, log_probs_in_micro_batches

pytestmark = pytest.mark.integration

PROMPT_LEN, RESPONSE_LEN, TURN_TOKENS = 128, 160, 24
ROW = {
    "raw_prompt": [{"role": "user", "content": "Look up the weather, then tell me."}],
    "data_source": "stamps",
    "reward_model": {"ground_truth": ""},
    "extra_info": {"index": 0},
}


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen3_path):
    return AutoTokenizer.from_pretrained(tiny_qwen3_path)


class EndingTurns:
    """The server manager with each turn closed after ``TURN_TOKENS`` sampled tokens (its
    end-of-turn token forced then): a turn cut by max_tokens could not be extended, and the
    tiny model's turns rarely end by themselves."""

    def __init__(self, manager: AsyncLLMServerManager, end_id: int) -> None:
        self.manager, self.end_id = manager, end_id

    async def generate(self, request):
        params = request.sampling_params.merged(
            {
                "min_tokens": TURN_TOKENS,
                "max_tokens": TURN_TOKENS + 1,
                "logit_bias": {self.end_id: 100.0},
            }
        )
        return await self.manager.generate(dataclasses.replace(request, sampling_params=params))


def _models(path) -> tuple[torch.nn.Module, torch.nn.Module]:
    old = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    new = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    torch.manual_seed(321)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return old, new


@pytest.mark.asyncio(loop_scope="module")
async def test_a_push_inside_a_tool_session_stamps_each_token_and_the_trainer_agrees(
    tiny_server, tokenizer, tiny_qwen3_path
):
    original = load_file(str(tiny_qwen3_path / "model.safetensors"))
    old, new = _models(tiny_qwen3_path)
    manager = AsyncLLMServerManager([tiny_server])
    asked, pushed = asyncio.Event(), asyncio.Event()

    async def agent(row, llm) -> float:
        messages = list(row["raw_prompt"])
        params = {"max_tokens": TURN_TOKENS + 1, "temperature": 1.0}
        first = await llm.client.chat.completions.create(
            model=llm.model, messages=messages, **params
        )
        messages.append(first.choices[0].message.model_dump(exclude_none=True))
        asked.set()
        await pushed.wait()  # the tool takes its time; the trainer pushes meanwhile
        # a text agent's observation (the tiny model emits no native tool calls)
        messages.append({"role": "user", "content": "Observation: sunny, 21 C."})
        await llm.client.chat.completions.create(model=llm.model, messages=messages, **params)
        return 1.0

    async def trainer_side() -> None:
        await asked.wait()
        await manager.pause(abort=True)
        await load_named(tiny_server, list(new.state_dict().items()), 1 << 20)
        manager.resume(1)
        pushed.set()

    config = RolloutConfig(prompt_length=PROMPT_LEN, response_length=RESPONSE_LEN)
    end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    context = AgentLoopContext(EndingTurns(manager, end_id), tokenizer, config)
    loop = GatewayAgentLoop(context, agent=agent)
    try:
        out, _ = await asyncio.gather(loop.run(config.sampling_params(), **ROW), trainer_side())
    finally:
        await context.gateway.stop()
        await load_named(tiny_server, list(original.items()))

    assert "agent_error" not in out.extra, out.extra.get("agent_error")
    batch = collate(
        [out],
        [{**ROW, "uid": "u0", "agent_name": "gateway"}],
        prompt_length=PROMPT_LEN,
        response_length=RESPONSE_LEN,
        pad_token_id=tokenizer.pad_token_id or 0,
    )
    assert len(batch) == 1 and batch.num_turns[0] >= 2  # one segment: the session extends
    versions, mask = batch.rollout_versions[0], batch.response_mask[0].bool()
    real = batch.attention_mask[0, PROMPT_LEN:].bool()
    stamped = versions[mask].tolist()
    k = stamped.count(0)
    assert 0 < k < len(stamped) and stamped == [0] * k + [1] * (len(stamped) - k)
    tool = real & ~mask  # the tool's answer (and the template around it): no version
    assert tool.any() and (versions[tool] == -1).all()
    # the first turn is v0, the tool answer follows it, the second turn is v1
    first_tool = int(tool.nonzero()[0])
    assert (versions[:first_tool][mask[:first_tool]] == 0).all()
    assert (versions[first_tool:][mask[first_tool:]] == 1).all()

    train = TrainBatch(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        response_mask=batch.response_mask,
    )
    at_old = log_probs_in_micro_batches(old, train, micro_batch_size=1)[0][0]
    at_new = log_probs_in_micro_batches(new, train, micro_batch_size=1)[0][0]
    stored = batch.rollout_log_probs[0]
    expected = torch.where(versions == 0, at_old, at_new)
    # The forced end-of-turn tokens are left out: the engine stores their biased log-prob.
    free = mask & (batch.responses[0] != end_id)
    assert int(free.sum()) == 2 * TURN_TOKENS
    gap = (stored - expected)[free].abs().max().item()
    assert gap < 1e-3, gap
    # the control: the second turn is not the old weights' (the stamps matter)
    late = free & (versions == 1)
    assert (stored - at_old)[late].abs().mean().item() > 1e-2
