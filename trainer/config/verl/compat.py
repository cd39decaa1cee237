"""verl run scripts as they are: ``--config-path``/``--config-name`` config files and
``key=value`` overrides whose keys are verl's (``trainer.config.verl.keys``).

Aliases are rewritten to our key before Hydra sees them (one field, two spellings: both set
to different values is an error), warned keys are dropped with a one-time warning saying
why they do nothing here, refused keys stop the start with the alternative.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from trainer.config import warn_no_effect
from trainer.config.verl.keys import NO_MEGATRON, KeyRule, rule_for

__all__ = [
    "ConfigFile",
    "place_engine_kwargs",
    "split_config_args",
    "translate_overrides",
    "translate_tree",
]

logger = logging.getLogger(__name__)

DEFAULTS_OK = ("ppo_trainer", "_self_")

FREE_FORM = tuple(
    f"{mapping}."
    for mapping in (
        "actor_rollout_ref.rollout.engine_kwargs.vllm",
        "actor_rollout_ref.rollout.engine_kwargs.sglang",
        "actor_rollout_ref.rollout.engine.engine_kwargs",
        "actor_rollout_ref.rollout.chat_template_kwargs",
        "custom_reward_function.reward_kwargs",
    )
)
"""Mappings whose entries are passed on as they are: ``key=value`` adds or replaces one
(Hydra would want a ``+`` for a new entry; verl's scripts write none where its yaml
predefines the entry)."""


class ConfigFile:
    """A ``--config-path``/``--config-name`` pair (Hydra's ``-cp``/``-cn`` too)."""

    def __init__(self, path: str | None, name: str) -> None:
        self.path = Path(path or ".")
        self.name = name[:-5] if name.endswith(".yaml") else name

    @property
    def file(self) -> Path:
        return self.path / f"{self.name}.yaml"


def split_config_args(argv: list[str]) -> tuple[list[str], ConfigFile | None]:
    """``argv`` without ``--config-path``/``--config-name`` (``=`` or a separate value), and
    the config file they name (None when no ``--config-name`` is given)."""
    flags = {"--config-path": "path", "-cp": "path", "--config-name": "name", "-cn": "name"}
    found: dict[str, str] = {}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        flag, eq, value = arg.partition("=")
        if flag in flags:
            if not eq:
                if i + 1 >= len(argv):
                    raise ValueError(f"{flag} needs a value, e.g. {flag}=<folder or name>")
                value = argv[i + 1]
                i += 1
            found[flags[flag]] = value
        elif arg.startswith("-"):
            raise ValueError(
                f"unknown option {arg}: this command takes key=value overrides, "
                "--config-path and --config-name"
            )
        else:
            rest.append(arg)
        i += 1
    if "name" not in found:
        if "path" in found:
            raise ValueError("--config-path needs --config-name=<file name without .yaml>")
        return rest, None
    return rest, ConfigFile(found.get("path"), found["name"])


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _apply(rule: KeyRule, key: str, value: str) -> str | None:
    """Our key for ``key`` (None: drop it); warns or raises per the rule."""
    if rule.status == "alias":
        return rule.alias_of(key)
    if _unquote(value).lower() in rule.ok:
        return None
    if rule.status == "refuse":
        raise ValueError(f"{key}={_unquote(value)} is not supported here: {rule.why}")
    warn_no_effect(logger, key, _unquote(value), f"here: {rule.why}")
    return None


def translate_overrides(overrides: list[str]) -> list[str]:
    """Hydra overrides with verl's keys translated (see the module doc)."""
    out: list[str] = []
    origin: dict[str, tuple[str, str]] = {}  # our key -> (spelling used, value)
    for item in overrides:
        prefix = item[: len(item) - len(item.lstrip("+~"))]
        key, eq, value = item[len(prefix) :].partition("=")
        rule = rule_for(key)
        if rule is not None and not (prefix == "~" and rule.status != "alias"):
            target = _apply(rule, key, value)
            if target is None:
                continue
            key = target
        if not prefix and eq and key.startswith(FREE_FORM):
            prefix = "++"  # verl's yaml predefines some of these entries; ours are empty
        if eq:
            seen = origin.get(key)
            if seen and seen[0] != item.partition("=")[0] and _unquote(seen[1]) != _unquote(value):
                raise ValueError(
                    f"{seen[0].lstrip('+')}={seen[1]} and {item} set one key ({key}) to "
                    "different values: keep one"
                )
            origin[key] = (item.partition("=")[0], value)
        out.append(f"{prefix}{key}{eq}{value}")
    return out


def _flatten(tree: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    items: list[tuple[str, Any]] = []
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and rule_for(key) is None:
            items.extend(_flatten(v, f"{key}."))
        else:
            items.append((key, v))
    return items


def _put(tree: dict[str, Any], key: str, value: Any) -> None:
    *parents, leaf = key.split(".")
    node = tree
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


def translate_tree(tree: dict[str, Any]) -> dict[str, Any]:
    """A config file's tree (without ``defaults``/``hydra``) with verl's keys translated."""
    out: dict[str, Any] = {}
    origin: dict[str, tuple[str, Any]] = {}
    for key, value in _flatten(tree):
        rule = rule_for(key)
        if isinstance(value, dict) and rule is not None and rule.status != "alias":
            # A mapping under a warned/refused key: each value is judged (an empty or
            # all-null one, verl's default, says nothing).
            for sub, sub_value in _flatten(value, f"{key}."):
                _apply(rule, sub, "null" if sub_value is None else str(sub_value))
            continue
        if rule is None:
            target: str | None = key
        elif rule.status == "alias":
            target = rule.alias_of(key)
        else:
            target = _apply(rule, key, "null" if value is None else str(value))
        if target is None:
            continue
        seen = origin.get(target)
        if seen and seen[0] != key and seen[1] != value:
            raise ValueError(
                f"{seen[0]}: {seen[1]} and {key}: {value} set one key ({target}) to different "
                "values: keep one"
            )
        origin[target] = (key, value)
        _put(out, target, value)
    return out


BACKENDS = ("vllm", "sglang")
"""The tables of verl's ``actor_rollout_ref.rollout.engine_kwargs``."""


def place_engine_kwargs(tree: dict[str, Any]) -> dict[str, Any]:
    """The composed ``tree`` with verl's per-backend ``actor_rollout_ref.rollout.engine_kwargs``
    tables replaced by the running backend's table in ``rollout.engine.engine_kwargs`` (the
    other table is unused, as in verl); an entry also set there to another value is an error.
    Runs after composition, when ``rollout.engine.backend`` (verl's ``rollout.name``) is known."""
    rollout = tree.get("actor_rollout_ref", {}).get("rollout", {})
    tables = rollout.pop("engine_kwargs", None) or {}
    key = "actor_rollout_ref.rollout.engine_kwargs"
    if not isinstance(tables, dict):
        raise ValueError(f"{key} must be a mapping of backend tables ({', '.join(BACKENDS)})")
    unknown = sorted(set(tables) - set(BACKENDS))
    if unknown:
        raise ValueError(
            f"unknown config key {key}.{unknown[0]}; known keys under {key}: {', '.join(BACKENDS)}"
        )
    engine = rollout.setdefault("engine", {})
    backend = engine.get("backend", "vllm")
    table = tables.get(backend) or {}
    own = engine.setdefault("engine_kwargs", {}) or {}
    for name, value in table.items():
        if name in own and own[name] != value:
            raise ValueError(
                f"{key}.{backend}.{name}={value} and actor_rollout_ref.rollout.engine."
                f"engine_kwargs.{name}={own[name]} set one argument to different values: keep one"
            )
    engine["engine_kwargs"] = {**own, **table}
    return tree


def read_config_file(source: ConfigFile) -> dict[str, Any] | None:
    """The user's config file, checked and translated: ``defaults`` may only name
    ``ppo_trainer`` and ``_self_``; the ``hydra`` block (``searchpath``: verl's config folder)
    is set aside, since ``ppo_trainer`` is ours. ``--config-name=ppo_trainer`` with no such
    file is ours (None: no file)."""
    from omegaconf import OmegaConf

    file = source.file
    if not file.is_file() and source.name == "ppo_trainer":
        return None  # verl's own ppo_trainer.yaml: ours stands in for it
    if not file.is_file() and source.name == "ppo_megatron_trainer":
        raise ValueError(f"--config-name=ppo_megatron_trainer: {NO_MEGATRON}")
    if not file.is_file():
        raise ValueError(
            f"--config-name={source.name}: no file {file} (--config-path={source.path}; "
            f"the folder is relative to {os.getcwd()})"
        )
    raw = OmegaConf.to_container(OmegaConf.load(file), resolve=False)
    if not isinstance(raw, dict):
        raise ValueError(f"{file} must be a mapping of config keys")
    defaults = raw.pop("defaults", ["ppo_trainer", "_self_"])
    bad = [d for d in defaults if not (isinstance(d, str) and d in DEFAULTS_OK)]
    if bad == ["ppo_megatron_trainer"]:
        raise ValueError(f"{file}: defaults entry 'ppo_megatron_trainer': {NO_MEGATRON}")
    if bad:
        raise ValueError(
            f"{file}: defaults entry {bad[0]!r} is not known here; a config file here extends "
            "ppo_trainer (defaults: [ppo_trainer, _self_]) and sets keys of it"
        )
    hydra = raw.pop("hydra", None) or {}
    extra = sorted(set(hydra) - {"searchpath"}) if isinstance(hydra, dict) else []
    if extra:
        logger.warning("%s: hydra.%s has no effect here (only the config is read)", file, extra[0])
    return translate_tree(raw)
