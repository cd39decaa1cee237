"""One source of config defaults: the typed dataclasses. ``ppo_trainer.yaml`` /
``sft_trainer.yaml`` are written from them (``make config``); the committed files are what the
generator writes, they hold every field with its default (the walk below reads them back), so
a plain ``key=value`` override (no ``+``) sets any field and it lands in the dataclass."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

import trainer.config as config_pkg
from agentloop.config import _check
from trainer.config import Config, ConfigError, compose_tree, generate, load_config
from trainer.config.field_docs import field_docs
from trainer.config.generate import MISSING, _dataclass_of, _default, _plain
from trainer.config.reward import DEFAULT_JUDGE_TEMPLATE, RuleRewardConfig
from trainer.config.run import RunConfig, TrainerConfig
from trainer.config.sft import SFTConfig, SFTTrainerConfig, load_sft_config

CONFIG_DIR = Path(config_pkg.__file__).parent

# YAML values that follow another key; the dataclass holds what they resolve to by default.
INTERPOLATED = {spec.name: spec.interpolated for spec in generate.FILES}
CASES = [("ppo_trainer", Config), ("sft_trainer", SFTConfig)]


@pytest.mark.parametrize("spec", generate.FILES, ids=lambda spec: spec.name)
def test_the_committed_yaml_is_what_the_generator_writes(spec):
    assert spec.path.read_text() == generate.render(spec), (
        f"{spec.path} is out of date with the config dataclasses: run `make config` "
        "(python -m trainer.config.generate) and commit the file"
    )


def test_a_field_docstring_is_its_comment_beside_or_above_the_key():
    ppo = generate.render(generate.FILES[0]).splitlines()
    assert "  device: auto                 # auto: cuda when a GPU is visible, else cpu." in ppo
    level = ppo.index("  worker_log_level: WARNING")  # too long to sit beside: above, wrapped
    assert ppo[level - 2 : level] == [
        "  # Level at which Ray workers (servers, agent-loop workers, trainer ranks) log to this "
        "console,",
        "  # vLLM's engine logs included; INFO shows the engines' start-up.",
    ]
    assert "    prompt_length: ${data.max_prompt_length}  # Prompt tokens kept per sample " in (
        "\n".join(ppo)
    )
    # A field written again by a subclass (another default) keeps its base's docstring.
    assert "project_name" in SFTTrainerConfig.__dataclass_fields__
    base, sft = field_docs(RunConfig), field_docs(SFTTrainerConfig)
    assert (
        sft["project_name"] == base["project_name"] == "MLflow experiment / W&B project of the run."
    )
    assert field_docs(TrainerConfig)["logger"] == base["logger"]


def test_the_generator_rewrites_a_stale_file_and_check_says_so(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(generate, "CONFIG_DIR", tmp_path)
    for spec in generate.FILES:
        (tmp_path / f"{spec.name}.yaml").write_text((CONFIG_DIR / f"{spec.name}.yaml").read_text())
    stale = tmp_path / "sft_trainer.yaml"
    stale.write_text(stale.read_text().replace("seed: 1", "seed: 2"))
    assert generate.main(["--check"]) == 1
    assert f"{stale} out of date with the dataclasses: run `make config`" in caplog.text
    assert generate.main([]) == 0
    assert stale.read_text() == (CONFIG_DIR / "sft_trainer.yaml").read_text()
    assert generate.main(["--check"]) == 0


def test_a_str_field_takes_a_bare_number_from_the_command_line():
    cfg, _ = load_config(["actor_rollout_ref.model.path=m", "trainer.experiment_name=2024"])
    assert cfg.trainer.experiment_name == "2024"
    assert cfg.trainer.default_local_dir == "checkpoints/agentloop/2024"
    cfg, _ = load_config(["actor_rollout_ref.model.path=m", "actor_rollout_ref.actor.cpu_cores=3"])
    assert cfg.actor_rollout_ref.actor.cpu_cores == 3  # str | int keeps the int
    with pytest.raises(ConfigError) as info:
        load_config(["actor_rollout_ref.model.path=m", "trainer.experiment_name=true"])
    assert str(info.value) == "trainer.experiment_name must be str, got bool True"


class _Walk:
    """Walks a dataclass tree beside the raw and the resolved YAML tree and collects every
    difference (``problems``) and the dotted path of every field (``paths``)."""

    def __init__(self, name: str) -> None:
        raw = OmegaConf.load(CONFIG_DIR / f"{name}.yaml")
        self.raw = OmegaConf.to_container(raw, resolve=False)
        self.resolved = OmegaConf.to_container(raw, resolve=True, throw_on_missing=False)
        self.interpolated = INTERPOLATED[name]
        self.problems: list[str] = []
        self.paths: list[str] = []

    def dataclass(self, cls: type, owner: Any, raw: Any, resolved: Any, path: str) -> None:
        prefix = f"{path}." if path else ""
        if not isinstance(raw, dict):
            self.problems.append(f"{path}: YAML holds {raw!r}, not a mapping of {cls.__name__}")
            return
        hints = typing.get_type_hints(cls)
        fields = [f for f in dataclasses.fields(cls) if f.init]
        for extra in sorted(set(raw) - {f.name for f in fields}):
            self.problems.append(f"{prefix}{extra}: YAML key with no field in {cls.__name__}")
        for f in fields:
            key = f"{prefix}{f.name}"
            if f.name not in raw:
                self.problems.append(f"{key}: field of {cls.__name__} missing from the YAML")
                continue
            self.field(key, hints[f.name], _default(f, owner), raw[f.name], resolved[f.name])

    def field(self, key: str, hint: Any, default: Any, raw: Any, resolved: Any) -> None:
        self.paths.append(key)
        nested = _dataclass_of(hint)
        if nested is not None and (default is MISSING or dataclasses.is_dataclass(default)):
            owner = None if default is MISSING else default
            self.dataclass(nested, owner, raw, resolved, key)
            return
        if default is MISSING:
            if raw != "???":
                self.problems.append(f"{key}: no default in the dataclass, YAML has {raw!r}")
            return
        if key in self.interpolated:
            if raw != self.interpolated[key]:
                self.problems.append(f"{key}: YAML {raw!r}, expected {self.interpolated[key]!r}")
            raw = resolved
        try:  # builds list items as their element dataclass: unknown/missing keys show
            value = _check(key, hint, raw)
        except ValueError as exc:
            self.problems.append(f"{key}: YAML {raw!r} is not valid: {exc}")
            return
        if _plain(value) != _plain(default) or type(value) is not type(default):
            self.problems.append(f"{key}: YAML {raw!r} != dataclass default {default!r}")


def _walk(name: str, cls: type) -> _Walk:
    walk = _Walk(name)
    walk.dataclass(cls, None, walk.raw, walk.resolved, "")
    return walk


@pytest.mark.parametrize(("name", "cls"), CASES)
def test_yaml_and_dataclasses_have_the_same_keys_and_defaults(name, cls):
    walk = _walk(name, cls)
    assert walk.problems == []
    assert len(walk.paths) > 40


def test_the_walk_finds_every_kind_of_difference(tmp_path, monkeypatch):
    """The check above is only as good as its walk: a missing key, an extra key, a changed
    default, a None default that is not null, a list item that is no RuleRewardConfig and a
    wrong interpolation all show."""
    text = (CONFIG_DIR / "ppo_trainer.yaml").read_text()
    edits = [
        ("    run_id: null", ""),
        ("  seed: 0  ", "  stray: 1\n  seed: 0  "),
        ("    response_length: 512", "    response_length: 513"),
        ("  val_files: null", "  val_files: []"),
        ("  rules: []", "  rules: [{name: fmt, path: f.py, nope: 1}]"),
        ("${data.max_prompt_length}", "${data.train_batch_size}"),
    ]
    for old, new in edits:
        assert old in text
        text = text.replace(old, new)
    (tmp_path / "ppo_trainer.yaml").write_text(text)
    monkeypatch.setattr(f"{__name__}.CONFIG_DIR", tmp_path)
    problems = _walk("ppo_trainer", Config).problems
    assert problems == [
        "data.stray: YAML key with no field in DataConfig",
        "data.val_files: YAML [] != dataclass default None",
        "actor_rollout_ref.rollout.prompt_length: YAML '${data.train_batch_size}', expected "
        "'${data.max_prompt_length}'",
        "actor_rollout_ref.rollout.prompt_length: YAML 8 != dataclass default 1024",
        "actor_rollout_ref.rollout.response_length: YAML 513 != dataclass default 512",
        "actor_rollout_ref.rollout.trace.run_id: field of TraceConfig missing from the YAML",
        "reward_model.rules: YAML [{'name': 'fmt', 'path': 'f.py', 'nope': 1}] is not valid: "
        "unknown config key reward_model.rules[0].nope; known keys under reward_model.rules[0]: "
        "name, path, function, timeout_s, reward_kwargs",
    ]


@pytest.mark.parametrize(("name", "cls"), CASES)
def test_every_field_is_settable_without_a_plus(name, cls):
    """Hydra refuses ``key=value`` for a key the YAML lacks (it would need ``+key=value``):
    overriding every field at once proves each one is there."""
    paths = [p for p in _walk(name, cls).paths if "[" not in p]
    leaves = [p for p in paths if not any(q.startswith(f"{p}.") for q in paths)]
    tree = compose_tree(name, [f"{p}=null" for p in leaves], "unknown")
    for path in leaves:
        node: Any = tree
        for part in path.split("."):
            node = node[part]
        assert node is None, path


def test_dataclass_only_keys_are_set_with_plain_overrides_and_land_in_the_config():
    cfg, extras = load_config(
        [
            "actor_rollout_ref.model.path=tiny-qwen3",
            r"reward_model.judge.score_pattern='Score: (\d+)'",
            "reward_model.judge.prompt_template='Rate {response} against {ground_truth}'",
            "reward_model.judge.chat_template_kwargs.enable_thinking=true",
            "actor_rollout_ref.rollout.trace.run_id=0123abcd",
            "reward_model.rules=[{name: fmt, path: f.py, timeout_s: 5}]",
            "+reward_model.weights.fmt=0.5",  # a new key of a dict field still takes a +
            "+output=o.jsonl",
        ]
    )
    judge = cfg.reward_model.judge
    assert judge.score_pattern == r"Score: (\d+)"
    assert judge.prompt_template == "Rate {response} against {ground_truth}"
    assert judge.chat_template_kwargs == {"enable_thinking": True}
    assert cfg.actor_rollout_ref.rollout.trace.run_id == "0123abcd"
    assert cfg.reward_model.rules == [RuleRewardConfig(name="fmt", path="f.py", timeout_s=5.0)]
    assert cfg.reward_model.weights == {"rule": 1.0, "judge": 1.0, "verify": 1.0, "fmt": 0.5}
    assert extras == {"output": "o.jsonl"}  # extras of a command still take a +


def test_yaml_defaults_are_the_effective_defaults():
    cfg, extras = load_config(["actor_rollout_ref.model.path=tiny-qwen3"])
    rollout, judge = cfg.actor_rollout_ref.rollout, cfg.reward_model.judge
    assert rollout.response_length == 512 and rollout.prompt_length == 1024
    assert judge.prompt_template == DEFAULT_JUDGE_TEMPLATE and judge.template() == (
        DEFAULT_JUDGE_TEMPLATE
    )
    assert judge.score_pattern == r"<score>\s*([-+]?\d+(?:\.\d+)?)\s*</score>"
    assert judge.chat_template_kwargs == {"enable_thinking": False}
    assert rollout.trace.run_id is None and extras == {}
    sft = load_sft_config(["model.path=tiny-qwen3", "data.train_files=d.jsonl"])
    assert sft.optim.lr == 1e-5 and sft.data.max_length == 2048


def test_a_stale_plus_on_a_key_the_yaml_now_has_says_to_drop_it():
    with pytest.raises(ConfigError) as info:
        load_config(["actor_rollout_ref.model.path=x", "+reward_model.judge.score_pattern='(.*)'"])
    assert str(info.value).startswith(
        "Could not append to config. An item is already at 'reward_model.judge.score_pattern'"
    )
    assert "remove + prefix: 'reward_model.judge.score_pattern='(.*)''" in str(info.value)
