"""Each run script's final ``agentloop-train`` override list (its own keys, then the
caller's), read with ``PY`` a stand-in that records its arguments (``tests.script_calls``):
the shared overrides of ``recipes/overrides.sh`` land in every script, no key is given twice,
and a script runs the same from the repository root and from any other directory."""

from __future__ import annotations

import pytest

from tests.script_calls import REPO, SFT_FOLDER, script_calls, train_overrides

ENV = {"MODEL": "m", "DATA": "d", "RUN": "r"}

# What each script passes with ENV (and SFT_STEPS=0), in any order.
TRAIN = {
    "recipes/nl2sql/run_cpu.sh": [
        "data.train_files=d/train.jsonl",
        "data.val_files=d/val.jsonl",
        "data.return_raw_chat=True",
        "data.train_batch_size=4",
        "data.max_prompt_length=512",
        "actor_rollout_ref.model.path=m",
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.response_length=256",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=4",
        "actor_rollout_ref.rollout.multi_turn.tool_config_path=recipes/nl2sql/tool_config.yaml",
        "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "reward_model.verify.path=recipes/nl2sql/reward.py",
        "reward_model.weights.rule=0",
        "trainer.n_gpus_per_node=2",
        "trainer.total_training_steps=4",
        "trainer.test_freq=2",
        "trainer.logger=[console,jsonl]",
        "trainer.default_local_dir=r",
    ],
    "recipes/search_r1/run_cpu.sh": [
        "data.train_files=d/train.jsonl",
        "data.val_files=d/val.jsonl",
        "data.return_raw_chat=True",
        "data.train_batch_size=4",
        "data.max_prompt_length=512",
        "actor_rollout_ref.model.path=m",
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.response_length=384",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=4",
        "actor_rollout_ref.rollout.multi_turn.max_tool_response_length=512",
        "actor_rollout_ref.rollout.multi_turn.tool_config_path=d/mcp_search.json",
        "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "custom_reward_function.path=recipes/search_r1/reward.py",
        "trainer.n_gpus_per_node=2",
        "trainer.total_training_steps=4",
        "trainer.test_freq=2",
        "trainer.logger=[console,jsonl]",
        "trainer.default_local_dir=r",
    ],
    "recipes/langgraph_agent/run_cpu.sh": [
        "data.train_files=d/train.jsonl",
        "data.val_files=d/val.jsonl",
        "data.return_raw_chat=True",
        "data.train_batch_size=4",
        "data.max_prompt_length=512",
        "actor_rollout_ref.model.path=m",
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.prompt_length=512",
        "actor_rollout_ref.rollout.response_length=256",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=5",
        "actor_rollout_ref.rollout.multi_turn.max_tokens_per_turn=64",
        "actor_rollout_ref.rollout.agent.agent_loop_config_path=recipes/langgraph_agent/agent.yaml",
        "actor_rollout_ref.rollout.agent.default_agent_loop=math_expression",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "custom_reward_function.path=recipes/langgraph_agent/reward.py",
        "custom_reward_function.name=compute_score",
        "trainer.n_gpus_per_node=2",
        "trainer.total_training_steps=4",
        "trainer.test_freq=2",
        "trainer.val_before_train=True",
        "trainer.logger=[console,jsonl]",
        "trainer.default_local_dir=r/grpo",
    ],
    "recipes/repo_fix/run_cpu.sh": [
        "data.train_files=d/train.jsonl",
        "data.val_files=d/val.jsonl",
        "data.return_raw_chat=True",
        "data.train_batch_size=4",
        "data.max_prompt_length=1024",
        "actor_rollout_ref.model.path=m",
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.response_length=1024",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=6",
        "actor_rollout_ref.rollout.multi_turn.max_tool_response_length=2048",
        "actor_rollout_ref.rollout.multi_turn.tool_config_path=recipes/repo_fix/tool_config.yaml",
        "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "trainer.n_gpus_per_node=2",
        "trainer.total_training_steps=4",
        "trainer.test_freq=2",
        "trainer.val_before_train=True",
        "trainer.logger=[console,jsonl]",
        "trainer.default_local_dir=r/grpo",
    ],
    "recipes/maze/run_cpu.sh": [
        "data.train_files=d/train.jsonl",
        "data.val_files=d/val.jsonl",
        "data.return_raw_chat=True",
        "data.train_batch_size=4",
        "data.max_prompt_length=512",
        "actor_rollout_ref.model.path=m",
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.response_length=1024",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=13",
        "actor_rollout_ref.rollout.multi_turn.tool_config_path=recipes/maze/tool_config.yaml",
        "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.use_dynamic_bsz=True",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=3072",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "algorithm.adv_estimator=gigpo",
        "algorithm.gamma=0.95",
        "custom_reward_function.path=recipes/maze/reward.py",
        "reward_model.process_reward_coef=1.0",
        "trainer.n_gpus_per_node=2",
        "trainer.total_training_steps=4",
        "trainer.test_freq=2",
        "trainer.val_before_train=True",
        "trainer.logger=[console,jsonl]",
        "trainer.default_local_dir=r/gigpo",
    ],
    "examples/gsm8k/run_gsm8k_tool_agent_cpu.sh": [
        "data.train_files=d/train.parquet",
        "data.val_files=d/test.parquet",
        "data.return_raw_chat=True",
        "data.train_batch_size=4",
        "data.max_prompt_length=512",
        "actor_rollout_ref.model.path=m",
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.response_length=512",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=5",
        "actor_rollout_ref.rollout.multi_turn.tool_config_path=examples/gsm8k/tool_config.yaml",
        "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
        "actor_rollout_ref.rollout.trace.backend=mlflow",
        "actor_rollout_ref.rollout.trace.token2text=True",
        "actor_rollout_ref.rollout.trace.max_samples_per_step_per_worker=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "trainer.n_gpus_per_node=2",
        "trainer.total_training_steps=4",
        "trainer.test_freq=2",
        "trainer.logger=[console,mlflow]",
        "trainer.project_name=gsm8k_tool_agent",
        "trainer.default_local_dir=r",
    ],
    "recipes/search_r1/run_8gpu.sh": [
        "data.train_files=d/train.jsonl",
        "data.val_files=d/val.jsonl",
        "data.return_raw_chat=True",
        "data.train_batch_size=512",
        "data.max_prompt_length=4096",
        "actor_rollout_ref.model.path=m",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.n=5",
        "actor_rollout_ref.rollout.response_length=2048",
        "actor_rollout_ref.rollout.num_servers=8",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=5",
        "actor_rollout_ref.rollout.multi_turn.max_parallel_calls=2",
        "actor_rollout_ref.rollout.multi_turn.max_tool_response_length=1024",
        "actor_rollout_ref.rollout.multi_turn.tool_config_path=d/mcp_search.json",
        "actor_rollout_ref.rollout.agent.num_workers=8",
        "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
        "actor_rollout_ref.actor.ppo_mini_batch_size=256",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "custom_reward_function.path=recipes/search_r1/reward.py",
        "trainer.device=cuda",
        "trainer.n_gpus_per_node=8",
        "trainer.total_training_steps=1000",
        "trainer.save_freq=50",
        "trainer.test_freq=50",
        "trainer.logger=[console,mlflow]",
        "trainer.default_local_dir=r",
    ],
    "examples/gsm8k/run_gsm8k_tool_agent_gpu.sh": [
        "data.train_files=d/train.parquet",
        "data.val_files=d/test.parquet",
        "data.return_raw_chat=True",
        "data.train_batch_size=256",
        "data.max_prompt_length=1024",
        "actor_rollout_ref.model.path=m",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.rollout.response_length=1024",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.num_servers=8",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.5",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=5",
        "actor_rollout_ref.rollout.multi_turn.tool_config_path=examples/gsm8k/tool_config.yaml",
        "actor_rollout_ref.rollout.agent.num_workers=8",
        "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
        "actor_rollout_ref.rollout.trace.backend=mlflow",
        "actor_rollout_ref.rollout.trace.token2text=True",
        "actor_rollout_ref.rollout.trace.max_samples_per_step_per_worker=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=64",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "trainer.device=cuda",
        "trainer.n_gpus_per_node=8",
        "trainer.total_training_steps=200",
        "trainer.save_freq=20",
        "trainer.test_freq=10",
        "trainer.logger=[console,mlflow]",
        "trainer.project_name=gsm8k_tool_agent",
        "trainer.default_local_dir=r",
    ],
}

# The data script each CPU recipe runs when DATA holds no data yet.
DATA_CALLS = {
    "recipes/nl2sql/run_cpu.sh": "recipes.nl2sql.data --out d --train 64 --val 16",
    "recipes/search_r1/run_cpu.sh": "recipes.search_r1.data --out d --synthetic",
    "recipes/langgraph_agent/run_cpu.sh": "recipes.langgraph_agent.data --out d --sft 512",
    "recipes/repo_fix/run_cpu.sh": "recipes.repo_fix.make_tasks --out d --train 256 --val 64",
    "recipes/maze/run_cpu.sh": "recipes.maze.data --out d --train 256 --val 64 --sft 256",
}


def key(override: str) -> str:
    return override.split("=", 1)[0]


@pytest.mark.parametrize("script", sorted(TRAIN))
def test_a_script_passes_its_overrides_then_the_callers(tmp_path, script):
    calls = script_calls(script, tmp_path, "trainer.total_training_steps=1", **ENV, SFT_STEPS="0")
    *own, last = train_overrides(calls)
    assert last == "trainer.total_training_steps=1"
    assert sorted(own) == sorted(TRAIN[script])
    keys = [key(o) for o in own]
    assert len(keys) == len(set(keys)), "a key given twice"


@pytest.mark.parametrize("script", sorted(TRAIN))
def test_a_script_runs_in_the_repository_root_from_any_directory(tmp_path, script):
    here = script_calls(script, tmp_path / "a", **ENV, SFT_STEPS="0")
    elsewhere = script_calls(REPO / script, tmp_path / "b", cwd=tmp_path, **ENV, SFT_STEPS="0")
    assert elsewhere == here
    assert {c.cwd for c in elsewhere} == {REPO}
    for override in train_overrides(elsewhere):  # the repository's files it names exist
        value = override.split("=", 1)[1]
        if value.startswith(("recipes/", "examples/")):
            assert (REPO / value).is_file(), override


@pytest.mark.parametrize("script", sorted(DATA_CALLS))
def test_a_cpu_recipe_makes_its_data_when_missing(tmp_path, script):
    calls = script_calls(script, tmp_path, **ENV, SFT_STEPS="0")
    assert calls[0].args == ["-m", *DATA_CALLS[script].split()]


@pytest.mark.parametrize(
    ("script", "data_module", "micro_batch"),
    [
        ("recipes/langgraph_agent/run_cpu.sh", "recipes.langgraph_agent.data", 4),
        ("recipes/repo_fix/run_cpu.sh", "recipes.repo_fix.make_tasks", 2),
        ("recipes/maze/run_cpu.sh", "recipes.maze.data", 4),
    ],
)
def test_a_recipe_with_a_warm_start_trains_from_its_sft_export(
    tmp_path, script, data_module, micro_batch
):
    calls = script_calls(script, tmp_path, **ENV)
    assert [c.args[1] for c in calls] == [data_module, "trainer.cli.sft", "trainer.cli.train"]
    assert calls[1].args[2:] == [
        "data.train_files=d/sft.jsonl",
        "data.train_batch_size=16",
        f"data.micro_batch_size_per_gpu={micro_batch}",
        "model.path=m",
        "optim.lr=1e-4",
        "trainer.n_gpus_per_node=2",
        "trainer.total_training_steps=16",
        "trainer.default_local_dir=r/sft",
    ]
    assert f"actor_rollout_ref.model.path={SFT_FOLDER}" in train_overrides(calls)


def test_repo_fix_takes_the_harness_loops_and_a_prompt_length_for_a_coding_cli(tmp_path):
    harness = {"LOOPS": "recipes/repo_fix/harness_loops.yaml", "PROMPT_LEN": "16384"}
    calls = script_calls("recipes/repo_fix/run_cpu.sh", tmp_path, **ENV, SFT_STEPS="0", **harness)
    own = train_overrides(calls)
    plain = TRAIN["recipes/repo_fix/run_cpu.sh"]
    loops = "actor_rollout_ref.rollout.agent.agent_loop_config_path="
    assert sorted(own) == sorted(
        [o.replace("=1024", "=16384") if o.startswith("data.max_prompt") else o for o in plain]
        + [loops + harness["LOOPS"]]
    )
    assert (REPO / harness["LOOPS"]).is_file()


@pytest.mark.parametrize(
    ("credit", "keys"),
    [
        ("grpo", ["algorithm.adv_estimator=grpo"]),
        ("turn_credit", ["algorithm.adv_estimator=grpo", "algorithm.turn_credit.coef=1.0"]),
        ("gigpo", ["algorithm.adv_estimator=gigpo", "algorithm.gamma=0.95"]),
    ],
)
def test_the_maze_takes_its_credit_and_its_simulated_user_version(tmp_path, credit, keys):
    script = "recipes/maze/run_cpu.sh"
    calls = script_calls(script, tmp_path, **ENV, SFT_STEPS="0", CREDIT=credit, TALK="1")
    got = train_overrides(calls)
    assert all(k in got for k in keys) and f"trainer.default_local_dir=r/{credit}" in got
    assert "data.train_files=d/train_talk.jsonl" in got
    assert (
        "actor_rollout_ref.rollout.multi_turn.interaction_config_path="
        "recipes/maze/interaction_config.yaml"
    ) in got
    assert not any("tool_config_path" in o or "process_reward_coef" in o for o in got)
    from trainer.config import load_config

    config, _ = load_config([o for o in got if not o.startswith("data.")])
    assert config.actor_rollout_ref.rollout.multi_turn.max_user_turns == 12


def test_the_maze_settles_progress_on_the_tool_rows_only(tmp_path):
    script = "recipes/maze/run_cpu.sh"
    settle = "+custom_reward_function.reward_kwargs.settle=0.1"
    got = train_overrides(script_calls(script, tmp_path, **ENV, SFT_STEPS="0", SETTLE="0.1"))
    assert sorted(got) == sorted(TRAIN[script] + [settle])
    talk = train_overrides(
        script_calls(script, tmp_path, **ENV, SFT_STEPS="0", SETTLE="0.1", TALK="1")
    )
    assert settle not in talk
    from trainer.config import load_config

    config, _ = load_config([o for o in got if not o.startswith("data.")])
    assert config.custom_reward_function.reward_kwargs == {"settle": 0.1}
