"""``multi_turn.format`` at start-up (``prepare_rollout``, before any server starts): an
unknown name and a family whose end-of-turn tokens the tokenizer lacks are errors naming
the key; unset, the format is derived from the chat template and written into the config."""

from __future__ import annotations

import pytest

from agentloop.config import MultiTurnConfig
from trainer.config.actor import ModelConfig
from trainer.config.schema import ActorRolloutRefConfig, Config
from trainer.launch.rollout import prepare_rollout


def config_with(format: str | None) -> Config:
    config = Config(actor_rollout_ref=ActorRolloutRefConfig(model=ModelConfig(path="tiny-qwen3")))
    config.actor_rollout_ref.rollout.multi_turn = MultiTurnConfig(format=format)
    return config


def test_an_unknown_format_stops_the_start_naming_the_registered_ones(tiny_qwen3_path):
    with pytest.raises(ValueError) as info:
        prepare_rollout(config_with("gptoss"))
    message = str(info.value)
    assert message.startswith(
        "actor_rollout_ref.rollout.multi_turn.format: unknown multi_turn.format 'gptoss'; "
        "registered: "
    )
    for name in ("gpt-oss", "glm45", "hermes", "llama3_json", "mistral", "qwen"):
        assert f" {name}," in message or f" {name} " in message


def test_a_family_whose_end_tokens_the_tokenizer_lacks_stops_the_start(tiny_qwen3_path):
    with pytest.raises(ValueError) as info:
        prepare_rollout(config_with("gpt-oss"))
    assert str(info.value) == (
        "actor_rollout_ref.rollout.multi_turn.format: multi_turn.format=gpt-oss ends model "
        "turns with <|call|> or <|return|>, but the tokenizer has none of them: set "
        "multi_turn.format to the model's family (or leave it unset to derive it from the "
        "chat template)"
    )


def test_an_unset_format_is_derived_from_the_chat_template(tiny_qwen3_path):
    config = config_with(None)
    prepare_rollout(config)
    assert config.actor_rollout_ref.rollout.multi_turn.format == "hermes"


def test_verl_s_qwen_name_is_kept_as_set(tiny_qwen3_path):
    config = config_with("qwen")
    prepare_rollout(config)
    assert config.actor_rollout_ref.rollout.multi_turn.format == "qwen"
