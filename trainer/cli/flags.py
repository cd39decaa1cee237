"""argparse flags generated from a typed dataclass, so a command's flags are written once, as
the config's fields: ``max_num_seqs: int | None = None`` plus the docstring under it becomes
``--max-num-seqs MAX_NUM_SEQS`` with that docstring as its help (read by
``trainer.config.field_docs``, which also gives the YAML comments).

Types: ``bool`` is ``--x/--no-x``; a ``Literal`` is its choices; ``int``, ``float`` and ``str``
convert; ``dict`` reads a JSON object; ``X | None`` is ``X`` (None stays the default); any
other union reads the text. A field with a ``default_factory`` has no default on the command
line (the dataclass builds it when the flag is absent).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any

from trainer.config.field_docs import field_docs

__all__ = ["add_dataclass_flags", "flag_name", "flag_values", "json_object"]


def flag_name(field: str) -> str:
    """``max_num_seqs`` -> ``--max-num-seqs``."""
    return "--" + field.replace("_", "-")


def json_object(text: str) -> dict[str, Any]:
    """A flag value that must be a JSON object (``'{"enforce_eager": true}'``)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object {{...}}, got {text!r}")
    return value


def _converter(annotation: Any) -> dict[str, Any]:
    """``add_argument`` keywords that read a value of ``annotation``."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        if len(args) == 1:
            return _converter(args[0])
        return {"type": str}  # e.g. ``str | int``: the dataclass reads the text
    if typing.get_origin(annotation) is typing.Literal:
        return {"choices": args, "type": type(args[0])}
    if annotation is bool:
        return {"action": argparse.BooleanOptionalAction}
    if annotation is dict or typing.get_origin(annotation) is dict:
        return {"type": json_object, "metavar": "JSON"}
    if annotation in (int, float, str):
        return {"type": annotation}
    raise TypeError(f"no command-line type for {annotation!r}")


def add_dataclass_flags(
    parser: argparse.ArgumentParser,
    cls: type,
    *,
    skip: Iterable[str] = (),
    defaults: Mapping[str, Any] | None = None,
) -> list[str]:
    """One ``--flag-name`` per field of dataclass ``cls`` not in ``skip``, in field order, its
    help the field's docstring (a field without one is a ``TypeError``); ``defaults`` replaces
    a field's default on the command line. Returns the fields added (the ``dest`` of each)."""
    docs, hints = field_docs(cls), typing.get_type_hints(cls)
    defaults = dict(defaults or {})
    added = []
    for field in dataclasses.fields(cls):
        if field.name in skip:
            continue
        if field.name not in docs:
            raise TypeError(f"{cls.__name__}.{field.name} has no docstring to be its help")
        kwargs = _converter(hints[field.name])
        if field.name in defaults:
            default = defaults.pop(field.name)
        elif field.default is not dataclasses.MISSING:
            default = field.default
        else:  # a default_factory builds it; a required field is required here too
            default = argparse.SUPPRESS
            kwargs["required"] = field.default_factory is dataclasses.MISSING
        help_text = docs[field.name].replace("%", "%%")
        if default is not None and default is not argparse.SUPPRESS:
            help_text += " (default: %(default)s)"
        parser.add_argument(flag_name(field.name), default=default, help=help_text, **kwargs)
        added.append(field.name)
    if defaults:
        raise TypeError(f"defaults for no flag of {cls.__name__}: {sorted(defaults)}")
    return added


def flag_values(args: argparse.Namespace, cls: type, *, skip: Iterable[str] = ()) -> dict[str, Any]:
    """The values ``args`` holds for the flags of ``add_dataclass_flags(parser, cls, skip=...)``
    (a flag without a default holds none when absent), as keyword arguments of ``cls``."""
    names = [f.name for f in dataclasses.fields(cls) if f.name not in skip]
    return {name: getattr(args, name) for name in names if hasattr(args, name)}
