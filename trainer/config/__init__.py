"""Hydra config: ``ppo_trainer.yaml`` composed with ``key=value`` overrides, then validated
into typed dataclasses. Keys added with ``+key=value`` at the root are returned as extras
(e.g. ``+output=out.jsonl`` for ``agentloop-rollout``). ``sft_trainer.yaml`` (``agentloop-sft``)
goes through the same composition and errors (``trainer.config.sft.load_sft_config``)."""

from __future__ import annotations

import dataclasses
import importlib
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer.config.schema import ActorRolloutRefConfig, Config, DataConfig, ModelConfig

# The schema (it pulls in agentloop's config, hence the agent loops and their parsers) loads on
# first use, so the FSDP workers' ``trainer.config.actor`` comes with torch alone (PEP 562).
_SCHEMA_NAMES = ("ActorRolloutRefConfig", "Config", "DataConfig", "ModelConfig")

__all__ = [
    "ActorRolloutRefConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "ModelConfig",
    "compose_tree",
    "load_command_config",
    "load_config",
    "warn_no_effect",
]


def __getattr__(name: str) -> Any:
    if name not in _SCHEMA_NAMES:
        raise AttributeError(f"module 'trainer.config' has no attribute {name!r}")
    value = getattr(importlib.import_module("trainer.config.schema"), name)
    globals()[name] = value
    return value


class ConfigError(ValueError):
    """A bad config key or value; the message says what to set."""


_warned: set[str] = set()
"""Keys already warned about in this process."""


def warn_no_effect(log: logging.Logger, key: str, value: object, why: str) -> None:
    """``key=value`` is accepted but does nothing (``why``: ``here: <reason>``, ``on CPU:
    <reason>``): one warning per key and process, however often the config is loaded."""
    if key in _warned:
        return
    _warned.add(key)
    log.warning("%s=%s has no effect %s", key, value, why)


def compose_tree(
    name: str,
    overrides: list[str] | None,
    unknown_hint: str,
    file_tree: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``trainer/config/<name>.yaml``, then ``file_tree`` (a user's config file extending it),
    then ``overrides``, resolved to plain containers. Hydra/OmegaConf errors become
    ``ConfigError``; ``unknown_hint`` follows the message for a key that does not exist
    (``unknown config key <key>: <hint>``)."""
    import tempfile

    from hydra import compose, initialize_config_dir, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    GlobalHydra.instance().clear()
    try:
        if file_tree is None:
            with initialize_config_module("trainer.config", version_base=None):
                cfg = compose(name, overrides=list(overrides or []))
        else:
            primary = {
                "hydra": {"searchpath": ["pkg://trainer.config"]},
                "defaults": [name, "_self_"],
                **file_tree,
            }
            with tempfile.TemporaryDirectory(prefix="agentloop-config-") as folder:
                OmegaConf.save(OmegaConf.create(primary), f"{folder}/user_config.yaml")
                with initialize_config_dir(folder, version_base=None):
                    cfg = compose("user_config", overrides=list(overrides or []))
        tree = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None)
        if key and "Missing mandatory value" in str(exc):
            raise ConfigError(f"missing config key {key}: set it, e.g. {key}=...") from None
        raise ConfigError(str(exc).splitlines()[0]) from None
    except HydraException as exc:
        lines = str(exc).splitlines()
        if lines[0].startswith("Could not override '"):
            key = lines[0].split("'")[1]
            raise ConfigError(f"unknown config key {key}: {unknown_hint}") from None
        raise ConfigError("; ".join(lines[:2])) from None
    assert isinstance(tree, dict)
    return tree


def load_config(overrides: list[str] | None = None) -> tuple[Config, dict[str, Any]]:
    """The typed config of ``overrides``: ``key=value`` items (verl's keys translated by
    ``trainer.config.verl.compat``), optionally ``--config-path``/``--config-name`` of a
    config file extending ``ppo_trainer``; plus the ``+key`` extras at the root."""
    from agentloop.config import from_dict
    from trainer.config.schema import Config
    from trainer.config.verl.compat import (
        place_engine_kwargs,
        read_config_file,
        split_config_args,
        translate_overrides,
    )

    try:
        args, source = split_config_args(list(overrides or []))
        file_tree = read_config_file(source) if source else None
        args = translate_overrides(args)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    tree = compose_tree(
        "ppo_trainer",
        args,
        "check its spelling against trainer/config/ppo_trainer.yaml and, for verl's keys, "
        "docs/verl-migration.md (extras for a command take a +, e.g. +output=out.jsonl)",
        file_tree,
    )
    sections = tuple(f.name for f in dataclasses.fields(Config))
    extras = {k: tree.pop(k) for k in list(tree) if k not in sections}
    try:
        return from_dict(Config, place_engine_kwargs(tree)), extras
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def load_command_config(
    prog: str, overrides: list[str], extras: Iterable[str] = ()
) -> tuple[Config, dict[str, Any]]:
    """``load_config(overrides)``, refusing any ``+key`` extra not among ``extras`` (those
    ``prog`` takes) with a ``ConfigError`` naming the first."""
    config, given = load_config(overrides)
    takes = list(extras)
    unknown = sorted(set(given) - set(takes))
    if unknown and not takes:
        raise ConfigError(f"unknown extra +{unknown[0]}: {prog} takes none")
    if unknown:
        listed = ", ".join(f"+{k}" for k in takes)
        raise ConfigError(f"unknown extra +{unknown[0]}; {prog} takes {listed}")
    return config, given
