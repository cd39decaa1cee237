"""``SimulatedUser`` against a scripted user server: it sees the conversation with the roles
swapped under its persona, its end marker ends the episode, a score pattern scores the turn;
it refuses to run without a user model."""

from __future__ import annotations

import pytest

from agentloop import AgentLoopContext, MultiTurnConfig, RolloutConfig
from agentloop.interactions import SimulatedUser, UserModel
from agentloop.tool_agent import ToolAgentLoop
from tests.unit.agentloop.scripted import ScriptedServer

PROMPT = [
    {"role": "system", "content": "You are a helpful agent."},
    {"role": "user", "content": "I need a refund."},
]
ROW = {"extra_info": {"interaction_kwargs": {"name": "customer", "goal": "a refund for order 7"}}}
CONFIG = {
    "name": "customer",
    "system_prompt": "You want {goal}. Say {end_marker} when you have it.",
    "score_pattern": r"<score>([0-9.]+)</score>",
}


async def test_the_user_model_sees_swapped_roles_and_its_marker_ends_the_episode(tokenizer):
    policy = ScriptedServer(tokenizer, ["Which order?", "Refunded order 7."])
    users = ScriptedServer(tokenizer, ["Order 7. <score>0.3</score>", "Thanks! [DONE]"])
    user = SimulatedUser(CONFIG)
    user.setup(UserModel(users, tokenizer, max_model_len=512))
    config = RolloutConfig(prompt_length=512, response_length=512)
    loop = ToolAgentLoop(
        AgentLoopContext(policy, tokenizer, config, {}, interactions={"customer": user})
    )
    out = await loop.run({"temperature": 1.0}, raw_prompt=PROMPT, **ROW)

    assert out.record.stop_reason == "interaction_done"
    assert out.record.interaction.turn_scores == [0.3, None]
    assert out.record.turn_scores == [0.3, 0.0]
    # the user's first request: its persona, then the policy's turns as "user" lines
    persona = "You want a refund for order 7. Say [DONE] when you have it."
    expected = tokenizer.apply_chat_template(
        [
            {"role": "system", "content": persona},
            {"role": "assistant", "content": "I need a refund."},
            {"role": "user", "content": "Which order?"},
        ],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
        enable_thinking=False,
    )
    assert users.requests[0]["prompt_ids"] == expected
    # the policy saw the user's line without the score tag
    second = tokenizer.decode(policy.requests[1]["prompt_ids"])
    assert second.rstrip().endswith("Order 7.<|im_end|>\n<|im_start|>assistant")
    assert users.requests[0]["max_tokens"] == 128 and users.requests[0]["temperature"] == 0.7
    assert user._prompts == {}  # finalized


def test_a_simulated_user_without_a_model_is_refused():
    with pytest.raises(ValueError) as exc:
        SimulatedUser({"name": "customer"}).setup(None)
    assert str(exc.value) == (
        "interaction 'customer' (SimulatedUser) needs a model: set "
        "actor_rollout_ref.rollout.multi_turn.user_model.model_path"
    )


async def test_a_persona_field_the_row_lacks_is_named():
    user = SimulatedUser({"name": "c", "system_prompt": "You are {persona}."})
    with pytest.raises(ValueError) as exc:
        await user.start_interaction("i", name="c", goal="x")
    assert str(exc.value) == (
        "system_prompt names {persona}, which the row's interaction_kwargs lack (it has: goal, "
        "name)"
    )


def test_start_up_refuses_a_model_backed_user_without_a_user_model(tmp_path):
    from trainer.launch.rollout import check_interactions

    path = tmp_path / "users.yaml"
    path.write_text(
        "interaction:\n  - name: customer\n    class_name: agentloop.interactions.SimulatedUser\n"
    )
    rollout = RolloutConfig(multi_turn=MultiTurnConfig(interaction_config_path=str(path)))
    with pytest.raises(ValueError) as exc:
        check_interactions(rollout)
    assert str(exc.value) == (
        "interaction 'customer' (SimulatedUser) is model-backed: set "
        "actor_rollout_ref.rollout.multi_turn.user_model.model_path"
    )
    rollout.multi_turn.user_model.model_path = "tiny-qwen3"
    assert check_interactions(rollout) == ["customer"]
