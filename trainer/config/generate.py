"""Writes ``ppo_trainer.yaml`` and ``sft_trainer.yaml`` from the config dataclasses, the one
source of the defaults: every field becomes a key with its default, in field order, and its
docstring (the string literal under the field, read with ``ast``) becomes the key's comment.
What the YAML holds beyond the dataclasses (the header, interpolations such as
``prompt_length: ${data.max_prompt_length}``) is written here, never into the files by hand.

    python -m trainer.config.generate          # or: make config
    python -m trainer.config.generate --check  # exit 1 when a committed file is stale

Hydra composes the written files as before (``trainer.config.compose_tree``)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import textwrap
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trainer.config.field_docs import field_docs
from trainer.config.schema import Config
from trainer.config.sft import SFTConfig

__all__ = ["FILES", "YamlFile", "main", "render"]

logger = logging.getLogger(__name__)

CONFIG_DIR = Path(__file__).resolve().parent
WIDTH = 100
COMMENT_COLUMN = 31
"""Where a comment that fits beside its key starts (as in verl's YAML)."""
MISSING = "???"
"""Hydra's mandatory value: a field without a default."""


@dataclass(frozen=True, slots=True)
class YamlFile:
    name: str
    """``<name>.yaml`` in trainer/config, the config name Hydra composes."""
    root: type
    header: str
    interpolated: dict[str, str] = field(default_factory=dict)
    """Keys whose YAML value follows another key; the dataclass holds what it resolves to by
    default."""

    @property
    def path(self) -> Path:
        return CONFIG_DIR / f"{self.name}.yaml"


def _header(what: str, source: str, example: str, *notes: str) -> str:
    """The file's opening comment: what it is, how it is kept, a command line."""
    text = (
        f"{what} Written by `make config` (python -m trainer.config.generate) from the typed "
        f"config, {source}: each field is a key with the field's default and its docstring as "
        "the comment. Edit the dataclasses and regenerate, never this file "
        "(tests/unit/trainer/test_config_defaults.py fails while it is stale). Override any "
        "key on the command line:"
    )
    return "\n".join([*textwrap.wrap(text, WIDTH - 2), f"  {example}", *notes])


FILES = (
    YamlFile(
        "ppo_trainer",
        Config,
        _header(
            "agentloop-rl configuration (verl key names).",
            "trainer/config/schema.py and the modules it imports (agentloop/config.py for the "
            "rollout)",
            "agentloop-rollout data.train_files=data/train.parquet "
            "actor_rollout_ref.model.path=tiny-qwen3",
            "Only a command's extras (+output=...) and new keys of a dict",
            "(+reward_model.weights.x=...) take a +.",
        ),
        {"actor_rollout_ref.rollout.prompt_length": "${data.max_prompt_length}"},
    ),
    YamlFile(
        "sft_trainer",
        SFTConfig,
        _header(
            "agentloop-sft configuration (verl SFT key names).",
            "trainer/config/sft.py",
            "agentloop-sft data.train_files=data/sft.jsonl model.path=tiny-qwen3 "
            "trainer.total_epochs=2",
        ),
    ),
)


def _dataclass_of(hint: Any) -> type | None:
    """The dataclass a field holds (``X`` or ``X | None``), else None."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        found = [_dataclass_of(a) for a in typing.get_args(hint)]
        return next((c for c in found if c is not None), None)
    return hint if isinstance(hint, type) and dataclasses.is_dataclass(hint) else None


def _default(f: dataclasses.Field, owner: Any) -> Any:
    """The field's default: read from ``owner`` (the parent's default instance) when there is
    one, else the field's own; ``MISSING`` when it has none."""
    if owner is not None:
        return getattr(owner, f.name)
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return MISSING


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _scalar(value: Any) -> str:
    """One value on one line, quoted where YAML needs it (flow style for lists)."""
    text = yaml.safe_dump(_plain(value), default_flow_style=True, width=10**6, sort_keys=False)
    return text.removesuffix("\n").removesuffix("\n...")


def _comment(doc: str) -> str:
    return " ".join(doc.replace("``", "`").split())


def _entry(indent: int, key: str, value: str, doc: str) -> list[str]:
    """``key: value`` with the docstring beside it when it fits, else above it."""
    line = f"{' ' * indent}{key}:{' ' if value else ''}{value}"
    if not doc:
        return [line]
    text = _comment(doc)
    beside = f"{line}{' ' * max(2, COMMENT_COLUMN - len(line))}# {text}"
    if len(beside) <= WIDTH:
        return [beside]
    pad = " " * indent
    return [f"{pad}# {part}" for part in textwrap.wrap(text, WIDTH - indent - 2)] + [line]


def _value(indent: int, key: str, value: Any, doc: str) -> list[str]:
    if isinstance(value, dict) and value:
        lines = _entry(indent, key, "", doc)
        for k, v in value.items():
            lines.extend(_value(indent + 2, str(k), v, ""))
        return lines
    if isinstance(value, str) and "\n" in value:
        pad = " " * (indent + 2)
        body = [f"{pad}{part}" if part else "" for part in value.split("\n")]
        return _entry(indent, key, "|-" if not value.endswith("\n") else "|", doc) + body
    return _entry(indent, key, _scalar(value), doc)


def _fields(spec: YamlFile, cls: type, owner: Any, indent: int, path: str) -> list[str]:
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    lines: list[str] = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if indent == 0 and lines:
            lines.append("")
        key = f"{path}.{f.name}" if path else f.name
        doc = docs.get(f.name, "")
        default = _default(f, owner)
        nested = _dataclass_of(hints[f.name])
        if nested is not None and (default is MISSING or dataclasses.is_dataclass(default)):
            lines.extend(_entry(indent, f.name, "", doc))
            nested_owner = None if default is MISSING else default
            lines.extend(_fields(spec, nested, nested_owner, indent + 2, key))
        elif key in spec.interpolated:
            lines.extend(_entry(indent, f.name, spec.interpolated[key], doc))
        elif default is MISSING:
            lines.extend(_entry(indent, f.name, MISSING, doc))
        else:
            lines.extend(_value(indent, f.name, default, doc))
    return lines


def render(spec: YamlFile) -> str:
    """The text of ``spec``'s YAML file."""
    header = [f"# {line}".rstrip() for line in spec.header.splitlines()]
    return "\n".join([*header, *_fields(spec, spec.root, None, 0, "")]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.config.generate", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 when a file is stale")
    args = parser.parse_args(argv)
    stale = []
    for spec in FILES:
        text = render(spec)
        if spec.path.is_file() and spec.path.read_text() == text:
            continue
        stale.append(spec.path)
        if not args.check:
            spec.path.write_text(text)
            logger.info("wrote %s", spec.path)
    if args.check and stale:
        names = ", ".join(str(p) for p in stale)
        logger.error("%s out of date with the dataclasses: run `make config`", names)
        return 1
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    raise SystemExit(main())
