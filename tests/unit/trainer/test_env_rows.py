"""``data.env_dataset``: rows from a verifiers environment's own dataset where the data files
are unset, each carrying its environment for the ``verifiers`` loop; bad keys say what to set."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agentloop.envs.verifiers_env import verifiers_python
from trainer.config.schema import EnvDatasetConfig
from trainer.data.env_rows import environment_rows

REPO = Path(__file__).resolve().parents[3]
HAS_VERIFIERS = (
    Path(verifiers_python()).is_relative_to(REPO / ".venv-verifiers")
    or "AGENTLOOP_VERIFIERS_PYTHON" in os.environ
)


def test_bad_keys_say_what_to_set():
    with pytest.raises(ValueError, match="data.env_dataset.train_split must be train or eval"):
        EnvDatasetConfig(train_split="test")
    with pytest.raises(ValueError, match=r"data.env_dataset.val_size must be -1 \(all\), 0"):
        EnvDatasetConfig(val_size=-2)


def test_no_environment_or_no_validation_rows_gives_no_files(tmp_path):
    assert environment_rows(EnvDatasetConfig(), "train", tmp_path) == []
    assert environment_rows(EnvDatasetConfig(verifiers="vf-calc"), "val", tmp_path) == []


@pytest.mark.slow
@pytest.mark.skipif(not HAS_VERIFIERS, reason="`make verifiers` makes .venv-verifiers")
def test_the_documented_overrides_make_train_and_validation_rows(tmp_path, monkeypatch):
    """docs/environments.md step 2, as written (its train command's data keys): rows of
    both splits, each carrying its environment and example."""
    from trainer.config import load_config

    monkeypatch.chdir(REPO)
    config, _ = load_config(
        [
            "actor_rollout_ref.model.path=tiny-qwen3",
            "data.env_dataset.verifiers=vf-calc",
            "data.env_dataset.paths=[examples/verifiers]",
            "+data.env_dataset.env_args.num_examples=64",
            "data.env_dataset.val_size=16",
        ]
    )
    env = config.data.env_dataset
    assert (env.verifiers, env.env_args, env.paths) == (
        "vf-calc",
        {"num_examples": 64},
        ["examples/verifiers"],
    )
    (train,) = environment_rows(env, "train", tmp_path)
    (val,) = environment_rows(env, "val", tmp_path)
    assert len(Path(train).read_text().splitlines()) == 64  # train_size -1: all
    rows = [json.loads(line) for line in Path(val).read_text().splitlines()]
    assert Path(val) == tmp_path / "env_rows" / "val.jsonl" and len(rows) == 16
    for row in rows:  # each row carries its environment and the environment's own example
        assert row["agent_name"] == "verifiers" and row["data_source"] == "verifiers/vf-calc"
        env = row["verifiers"]
        assert (env["env_id"], env["env_args"]) == ("vf-calc", {"num_examples": 64})
        assert env["paths"] == ["examples/verifiers"]
        assert env["example"]["prompt"] == row["raw_prompt"]
        assert row["reward_model"]["ground_truth"] == env["example"]["answer"]
        assert row["raw_prompt"][0]["role"] == "system"  # the environment's system prompt


@pytest.mark.slow
def test_an_environment_that_is_not_installed_fails_the_rows_naming_it(tmp_path):
    from agentloop.envs.verifiers_env import VerifiersNotInstalled, VerifiersSpec

    with pytest.raises(VerifiersNotInstalled, match="verifiers environment 'vf-nope' is not "):
        environment_rows(EnvDatasetConfig(verifiers="vf-nope"), "train", tmp_path)
    missing = VerifiersSpec(env_id="vf-calc", python=str(tmp_path / "python"))
    with pytest.raises(VerifiersNotInstalled, match=r"does not exist: run `make verifiers`"):
        missing.run("check")
