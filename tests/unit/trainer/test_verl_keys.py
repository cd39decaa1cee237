"""verl's run scripts and config files as they are: every key verl's example scripts set is
honored, warned about or refused exactly as docs/verl-migration.md says, aliases are one field
with two spellings, and ``--config-path``/``--config-name`` files extend ppo_trainer."""

from __future__ import annotations

import logging
import re
import shlex
from pathlib import Path

import pytest
import yaml

import trainer.config as config_pkg
from trainer.config import ConfigError, load_config
from trainer.config.verl.compat import place_engine_kwargs
from trainer.config.verl.keys import RULES, markdown_table, rule_for

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests" / "fixtures" / "verl"
DOC = (REPO / "docs" / "verl-migration.md").read_text()
MODEL = "actor_rollout_ref.model.path=tiny-qwen3"
OURS = yaml.safe_load((REPO / "trainer" / "config" / "ppo_trainer.yaml").read_text())


def ours(key: str) -> bool:
    """A key of ppo_trainer.yaml (or under one of its free-form mappings, e.g.
    ``chat_template_kwargs``)."""
    node = OURS
    for part in key.split("."):
        if node == {}:
            return True
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def status(key: str) -> str:
    rule = rule_for(key)
    if rule is None:
        return "honored" if ours(key) else "unknown"
    return {"alias": "honored", "warn": "warned", "refuse": "refused"}[rule.status]


def scripts(fixture: str = "multiturn_overrides.txt") -> dict[str, list[str]]:
    """Script name -> its overrides, as the shell passes them (quotes removed)."""
    out: dict[str, list[str]] = {}
    for block in (FIXTURES / fixture).read_text().split("\n\n"):
        lines = [line for line in block.splitlines() if line.strip()]
        names = [line[2:] for line in lines if line.startswith("# examples/")]
        if names:
            out[names[0]] = [shlex.split(line)[0] for line in lines if not line.startswith("#")]
    return out


def as_here(args: list[str]) -> list[str]:
    return [
        f"--config-path={FIXTURES / 'config'}" if a.startswith("--config-path=") else a
        for a in args
    ]


def doc_rows() -> dict[str, str]:
    """verl key (or pattern) -> the first word of its 'here' cell in the docs table."""
    rows = re.findall(r"^\| `([^`]+)` \| (\w+)", DOC, re.M)
    return dict(rows)


def doc_honored() -> set[str]:
    block = DOC.split("<!-- honored:start -->")[1].split("<!-- honored:end -->")[0]
    return set(re.findall(r"`([^`]+)`", block))


# ---- the docs table is the code's table ---------------------------------------------------------
def test_docs_table_is_the_rules_table():
    block = DOC.split("<!-- verl-keys:start -->\n")[1].split("<!-- verl-keys:end -->")[0]
    assert block == markdown_table(), "regenerate with: python -m trainer.config.verl.keys"


def test_each_multiturn_script_key_has_the_status_the_docs_give():
    rows, honored = doc_rows(), doc_honored()
    seen = 0
    for name, args in scripts().items():
        for arg in args:
            if arg.startswith("--config"):
                continue
            key = arg.split("=", 1)[0].lstrip("+")
            rule = rule_for(key)
            if rule is None:
                assert ours(key), f"{name}: {key} is neither a key here nor in the rules"
                assert key in honored, f"{key} (honored) is missing from the docs' honored list"
            else:
                assert rows[rule.key] == status(key), (name, key)
            seen += 1
    assert seen > 400  # 16 scripts


def test_every_key_of_verls_example_scripts_is_known():
    keys = [
        line
        for line in (FIXTURES / "all_script_keys.txt").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert len(keys) > 300
    unknown = [k for k in keys if status(k) == "unknown"]
    assert unknown == []


def test_docs_honored_list_names_only_our_keys():
    honored = doc_honored()
    assert len(honored) > 60
    assert [k for k in sorted(honored) if not ours(k) or rule_for(k)] == []


# ---- whole scripts ----
def test_multiturn_scripts_load_or_stop_on_a_refused_key(caplog):
    """Every script loads, unless it sets a refused key: then the error names that key."""
    loaded = []
    for name, args in scripts().items():
        refused = [
            a.split("=", 1)[0].lstrip("+")
            for a in args
            if not a.startswith("--") and status(a.split("=", 1)[0].lstrip("+")) == "refused"
        ]
        try:
            load_config(as_here(args))
        except ConfigError as exc:
            message = str(exc)
            assert refused or "ppo_megatron_trainer" in message, (name, message)
            assert any(message.startswith(f"{k}=") for k in refused) or (
                "Megatron is not a backend here" in message
            ), (name, message)
            continue
        assert not [k for k in refused if rule_for(k).ok == ()], name
        loaded.append(Path(name).name)
    assert {
        "run_qwen2.5-3b_gsm8k_tool_agent_mlflow.sh",
        "run_qwen2.5-3b_gsm8k_multiturn.sh",
        "run_qwen2.5-3b_gsm8k_multiturn_vllm_fsdp.sh",
        "run_qwen2.5-3b_gsm8k_multiturn_server.sh",
        "run_qwen3-4b_gsm8k_multiturn.sh",
        "run_qwen2.5-3b_geo3k_multiturn.sh",
        "run_qwen2.5-0.5b_gsm8k_multiturn_w_interaction.sh",  # interactions, activation offload
        "run_qwen0.5b_gsm8k_multiturn_curriculum.sh",  # data.sampler
        "run_gsm8k_grpo_toolcall_shaping.sh",  # data.sampler
        "run_qwen3_4b_dapo_multiturn.sh",  # data.custom_cls
    } <= set(loaded)
    # all 16 but the two Megatron ones (8 before interactions, samplers and custom datasets)
    assert len(scripts()) == 16 and len(loaded) == 14


@pytest.mark.slow
def test_of_verls_127_main_ppo_scripts_60_load_and_the_rest_stop_on_a_named_key():
    """All of verl's example scripts (tests/fixtures/verl/main_ppo_overrides.txt): each loads,
    or stops with an error naming what it set that has no equivalent here. 51 loaded before
    interactions, curriculum samplers, custom datasets and activation offload; 58 before
    verl's rollout-correction keys (its two rollout_correction examples load now)."""
    runs = scripts("main_ppo_overrides.txt")
    assert len(runs) == 127
    loaded, stopped = [], {}
    for name, args in runs.items():
        try:
            load_config(as_here(args))
            loaded.append(name)
        except ConfigError as exc:
            stopped[name] = str(exc)
    for name, message in stopped.items():
        keys = [a.split("=", 1)[0].lstrip("+~") for a in runs[name] if "=" in a]
        named = [k for k in keys if message.startswith(f"{k}=") or f"{k}" in message]
        assert named or "Megatron is not a backend here" in message, (name, message)
    assert len(loaded) == 60, sorted(stopped)
    assert {
        "examples/rollout_correction/run_with_rollout_corr.sh",
        "examples/rollout_correction/run_with_rollout_corr_multi_rs.sh",
    } <= set(loaded)


def test_the_tool_agent_script_means_what_it_means_in_verl():
    args = scripts()["examples/sglang_multiturn/run_qwen2.5-3b_gsm8k_tool_agent_mlflow.sh"]
    config, extras = load_config(as_here(args))
    assert extras == {}
    ref = config.actor_rollout_ref
    assert ref.rollout.response_length == 1024  # data.max_response_length
    assert config.data.max_prompt_length == 1024
    assert ref.actor.log_prob_micro_batch_size_per_gpu == 32  # rollout.log_prob_micro_...
    assert ref.ref.param_offload is True  # ref.fsdp_config.param_offload
    assert ref.rollout.multi_turn.max_assistant_turns == 5  # from the config file
    assert ref.rollout.engine.backend == "sglang"  # rollout.name
    assert ref.rollout.engine.tensor_parallel_size == 2  # rollout.tensor_model_parallel_size
    assert config.trainer.logger == ["console", "mlflow"]
    assert ref.model.path == "Qwen/Qwen2.5-3B-Instruct"


# ---- aliases ----
def test_an_alias_sets_our_key():
    config, _ = load_config([MODEL, "data.max_response_length=77"])
    assert config.actor_rollout_ref.rollout.response_length == 77


def test_an_alias_subtree_maps_under_our_key():
    config, _ = load_config([MODEL, "+data.apply_chat_template_kwargs.enable_thinking=false"])
    assert config.actor_rollout_ref.rollout.chat_template_kwargs == {"enable_thinking": False}


def test_entries_of_free_form_mappings_need_no_plus():
    config, _ = load_config(
        [
            MODEL,
            "actor_rollout_ref.rollout.name=sglang",
            "actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=fa3",
            "actor_rollout_ref.rollout.engine.engine_kwargs.mem_fraction_static=0.5",
            "data.apply_chat_template_kwargs.enable_thinking=false",
            "+custom_reward_function.reward_kwargs.method=flexible",
        ]
    )
    rollout = config.actor_rollout_ref.rollout
    assert rollout.engine.engine_kwargs == {"attention_backend": "fa3", "mem_fraction_static": 0.5}
    assert rollout.chat_template_kwargs == {"enable_thinking": False}
    assert config.custom_reward_function.reward_kwargs == {"method": "flexible"}


def test_verls_flat_engine_keys_set_the_engine_node():
    config, _ = load_config(
        [
            MODEL,
            "actor_rollout_ref.rollout.name=sglang",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
            "actor_rollout_ref.rollout.gpu_memory_utilization=0.7",
            "actor_rollout_ref.rollout.enforce_eager=True",
            "actor_rollout_ref.rollout.max_model_len=2048",
            "actor_rollout_ref.rollout.max_num_seqs=8",
        ]
    )
    engine = config.actor_rollout_ref.rollout.engine
    assert (engine.backend, engine.tensor_parallel_size, engine.gpu_memory_utilization) == (
        "sglang",
        2,
        0.7,
    )
    assert (engine.enforce_eager, engine.max_model_len, engine.max_num_seqs) == (True, 2048, 8)


def test_only_the_running_backends_engine_kwargs_table_is_used():
    config, _ = load_config(
        [
            MODEL,
            "actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=fa3",
            "+actor_rollout_ref.rollout.engine_kwargs.vllm.max_logprobs=5",
        ]
    )
    assert config.actor_rollout_ref.rollout.engine.engine_kwargs == {"max_logprobs": 5}


def test_an_engine_kwargs_table_of_no_backend_here_names_the_known_ones():
    tree = {"actor_rollout_ref": {"rollout": {"engine_kwargs": {"trtllm": {}}}}}
    with pytest.raises(ValueError) as info:
        place_engine_kwargs(tree)
    assert str(info.value) == (
        "unknown config key actor_rollout_ref.rollout.engine_kwargs.trtllm; known keys under "
        "actor_rollout_ref.rollout.engine_kwargs: vllm, sglang"
    )


def test_a_verl_engine_kwargs_entry_and_the_engine_nodes_with_different_values_is_an_error():
    with pytest.raises(ConfigError) as info:
        load_config(
            [
                MODEL,
                "actor_rollout_ref.rollout.engine_kwargs.vllm.max_logprobs=5",
                "actor_rollout_ref.rollout.engine.engine_kwargs.max_logprobs=7",
            ]
        )
    assert str(info.value) == (
        "actor_rollout_ref.rollout.engine_kwargs.vllm.max_logprobs=5 and actor_rollout_ref."
        "rollout.engine.engine_kwargs.max_logprobs=7 set one argument to different values: "
        "keep one"
    )


def test_both_spellings_with_different_values_is_an_error():
    with pytest.raises(ConfigError) as info:
        load_config(
            [MODEL, "data.max_response_length=77", "actor_rollout_ref.rollout.response_length=88"]
        )
    assert str(info.value) == (
        "data.max_response_length=77 and actor_rollout_ref.rollout.response_length=88 set one "
        "key (actor_rollout_ref.rollout.response_length) to different values: keep one"
    )


def test_both_spellings_with_one_value_is_fine():
    config, _ = load_config(
        [MODEL, "data.max_response_length=77", "actor_rollout_ref.rollout.response_length=77"]
    )
    assert config.actor_rollout_ref.rollout.response_length == 77


# ---- warned and refused ----
def test_a_warned_key_warns_once_and_its_verl_default_is_silent(caplog, monkeypatch):
    monkeypatch.setattr(config_pkg, "_warned", set())
    key = "actor_rollout_ref.actor.fsdp_config.optimizer_offload"
    with caplog.at_level(logging.WARNING, logger="trainer.config.verl.compat"):
        load_config([MODEL, f"{key}=False", "trainer.critic_warmup=0"])
        assert caplog.records == []
        load_config([MODEL, f"{key}=True"])
        load_config([MODEL, f"{key}=True"])
    assert [r.getMessage() for r in caplog.records] == [
        f"{key}=True has no effect here: optimizer state is offloaded together with the "
        "parameters by actor_rollout_ref.actor.fsdp_config.param_offload=True (FSDP2 "
        "CPUOffloadPolicy), not on its own"
    ]


def test_a_refused_key_names_the_alternative():
    with pytest.raises(ConfigError) as info:
        load_config([MODEL, "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"])
    assert str(info.value) == (
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 is not supported here: "
        "Megatron is not a backend here: the actor and reference are FSDP2 (strategy=fsdp2)"
    )


def test_a_refused_key_at_its_verl_default_is_accepted():
    config, _ = load_config(
        [MODEL, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=1", "data.image_key=images"]
    )
    assert config.data.train_batch_size == 8


def test_gae_turns_the_critic_on_as_verl_does():
    config, _ = load_config([MODEL, "algorithm.adv_estimator=gae", "algorithm.lam=0.95"])
    assert config.use_critic and config.critic.enable is None
    assert config.algorithm.lam == 0.95
    config, _ = load_config([MODEL])
    assert not config.use_critic


GAE_SCRIPTS_STOPPING = {
    # Megatron (--config-name=ppo_megatron_trainer)
    "run_deepseek_full_hh_rlhf.sh": "--config-name=ppo_megatron_trainer",
    "run_deepseek_math_gsm8k_megatron.sh": "--config-name=ppo_megatron_trainer",
    "run_deepseek_math_gsm8k_megatron_nsys.sh": "--config-name=ppo_megatron_trainer",
    "run_moonlight16b_a3b_gsm8k_megatron.sh": "--config-name=ppo_megatron_trainer",
    "run_qwen1.5_moe_a2.7b-gsm8k_megatron.sh": "--config-name=ppo_megatron_trainer",
    "run_qwen2-7b_math_gsm8k_megatron.sh": "--config-name=ppo_megatron_trainer",
    # a reward model (verl's discriminative RM; the model-based reward here is the judge)
    "run_qwen2-7b_rm.sh": "reward_model.model.path",
    "run_qwen2-7b_rm_legacy.sh": "reward_model.model.path",
    "run_qwen2-7b_rm_reward_loop_colocate.sh": "reward_model.model.path",
    "run_qwen2-7b_rm_seq_balance.sh": "reward_model.model.path",
    "run_qwen2-7b_rm_seq_balance_fused_kernels.sh": "reward_model.model.path",
    "run_qwen2-7b_rm_seq_balance_nsys.sh": "reward_model.model.path",
    "run_qwen2.5-3b_rm_legacy.sh": "reward_model.model.path",
    "run_qwen2.5-3b_rm_reward_loop_colocate.sh": "reward_model.model.path",
    # sequence parallelism, PF-PPO, sandbox fusion
    "run_deepseek7b_llm_sp2.sh": "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
    "run_qwen3-8b_npu.sh": "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
    "run_deepseek7b_llm_pfppo.sh": "algorithm.use_pf_ppo",
    "run_deepseek7b_llm_sandbox_fusion.sh": "reward_model.sandbox_fusion.url",
}


def test_verls_gae_scripts_load_with_a_critic_or_stop_on_a_refused_key():
    """verl's 25 PPO (GAE) example scripts: 7 load as they are (with the critic on and verl's
    critic keys in it); each of the other 18 stops on the refused key named above (Megatron,
    a discriminative reward model, sequence parallelism, PF-PPO, sandbox fusion)."""
    found = scripts("gae_overrides.txt")
    assert len(found) == 25
    loaded = []
    for name, args in found.items():
        short = Path(name).name
        try:
            config, _ = load_config(as_here(args))
        except ConfigError as exc:
            assert str(exc).startswith(GAE_SCRIPTS_STOPPING[short]), (short, str(exc))
            continue
        assert short not in GAE_SCRIPTS_STOPPING, short
        assert config.use_critic and config.algorithm.adv_estimator == "gae"
        values = dict(a.split("=", 1) for a in args if a.startswith("critic.optim.lr="))
        if values:  # verl's critic key reaches the critic
            assert config.critic.optim.lr == float(values["critic.optim.lr"])
        loaded.append(short)
    assert len(loaded) == 7, loaded


def test_trainer_logger_may_be_one_name():
    config, _ = load_config([MODEL, "trainer.logger=console"])
    assert config.trainer.logger == ["console"]


def test_an_unknown_key_points_at_the_migration_table():
    with pytest.raises(ConfigError, match=r"^unknown config key data\.nope: .*verl-migration\.md"):
        load_config([MODEL, "data.nope=1"])


# ---- config files ----
def write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.yaml").write_text(text)
    return folder


VERL_FILE = """\
hydra:
  searchpath:
    - file://verl/trainer/config
defaults:
  - ppo_trainer
  - _self_
data:
  max_prompt_length: 300
  max_response_length: 200
actor_rollout_ref:
  model:
    path: tiny-qwen3
  rollout:
    multi_turn:
      enable: True
      max_assistant_turns: 3
trainer:
  critic_warmup: 0
"""


@pytest.mark.parametrize(
    "flags",
    [
        ["--config-path={d}", "--config-name=mine"],
        ["--config-path", "{d}", "--config-name", "mine.yaml"],
        ["-cp", "{d}", "-cn", "mine"],
    ],
)
def test_a_config_file_extends_ppo_trainer_and_overrides_win(tmp_path, flags):
    folder = write(tmp_path, "mine", VERL_FILE)
    args = [f.format(d=folder) for f in flags] + ["data.max_prompt_length=400"]
    config, _ = load_config(args)
    assert config.data.max_prompt_length == 400  # the command line wins over the file
    assert config.actor_rollout_ref.rollout.response_length == 200  # the file's alias
    assert config.actor_rollout_ref.rollout.prompt_length == 400  # our interpolation
    assert config.actor_rollout_ref.rollout.multi_turn.max_assistant_turns == 3
    assert config.actor_rollout_ref.model.path == "tiny-qwen3"


def test_a_command_line_alias_beats_the_files_own_key(tmp_path):
    folder = write(tmp_path, "mine", VERL_FILE)
    config, _ = load_config(
        [f"--config-path={folder}", "--config-name=mine", "data.max_response_length=50"]
    )
    assert config.actor_rollout_ref.rollout.response_length == 50


def test_a_config_file_with_a_refused_key_stops(tmp_path):
    text = VERL_FILE.replace("data:\n", "data:\n  image_key: pics\n")
    folder = write(tmp_path, "bad", text)
    with pytest.raises(ConfigError) as info:
        load_config([f"--config-path={folder}", "--config-name=bad"])
    assert str(info.value) == (
        "data.image_key=pics is not supported here: images are not supported here (text-only rows)"
    )


def test_a_config_file_with_other_defaults_says_what_it_may_extend(tmp_path):
    folder = write(tmp_path, "mine", "defaults:\n  - dapo_trainer\n  - _self_\n")
    with pytest.raises(ConfigError) as info:
        load_config([f"--config-path={folder}", "--config-name=mine", MODEL])
    assert str(info.value) == (
        f"{folder / 'mine.yaml'}: defaults entry 'dapo_trainer' is not known here; a config "
        "file here extends ppo_trainer (defaults: [ppo_trainer, _self_]) and sets keys of it"
    )


def test_a_missing_config_file_names_the_path(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config([f"--config-path={tmp_path}", "--config-name=nope", MODEL])
    assert str(info.value).startswith(
        f"--config-name=nope: no file {tmp_path / 'nope.yaml'} (--config-path={tmp_path}; "
    )


def test_verls_own_ppo_trainer_is_ours(tmp_path):
    config, _ = load_config([f"--config-path={tmp_path}", "--config-name=ppo_trainer", MODEL])
    assert config.data.train_batch_size == 8
    config, _ = load_config(["--config-name=ppo_trainer.yaml", MODEL, "data.train_batch_size=4"])
    assert config.data.train_batch_size == 4


def test_verls_megatron_config_is_refused_by_name():
    with pytest.raises(ConfigError) as info:
        load_config(["--config-path=config", "--config-name=ppo_megatron_trainer.yaml", MODEL])
    assert str(info.value) == (
        "--config-name=ppo_megatron_trainer: Megatron is not a backend here: the actor and "
        "reference are FSDP2 (strategy=fsdp2)"
    )


def test_a_config_file_may_write_verls_defaults_as_whole_mappings(tmp_path, caplog):
    text = VERL_FILE.replace(
        "data:\n",
        "data:\n  custom_cls:\n    path: null\n    name: null\n  apply_chat_template_kwargs: {}\n",
    ).replace(
        "  rollout:\n",
        "  rollout:\n    engine_kwargs:\n      vllm: {}\n      trtllm: {}\n",
    )
    folder = write(tmp_path, "mine", text)
    with caplog.at_level(logging.WARNING, logger="trainer.config.verl.compat"):
        config, _ = load_config([f"--config-path={folder}", "--config-name=mine"])
    assert config.actor_rollout_ref.rollout.chat_template_kwargs == {}
    assert caplog.records == []


def test_config_path_without_a_name_is_an_error():
    with pytest.raises(ConfigError) as info:
        load_config(["--config-path=x", MODEL])
    assert str(info.value) == "--config-path needs --config-name=<file name without .yaml>"


@pytest.mark.parametrize("option", ["--multirun", "--config-dir=x"])
def test_an_unknown_option_is_an_error(option):
    with pytest.raises(ConfigError) as info:
        load_config([option, MODEL])
    assert str(info.value) == (
        f"unknown option {option}: this command takes key=value overrides, --config-path "
        "and --config-name"
    )


def test_no_rule_is_shadowed_by_an_earlier_one():
    for rule in RULES:
        probe = rule.key[:-1] + "x" if rule.key.endswith(".*") else rule.key
        probe = probe.replace("*", "actor")
        assert rule_for(probe) is rule, f"{rule.key} is shadowed by {rule_for(probe).key}"
