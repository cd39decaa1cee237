"""A model given by folder, ``agentloop-models`` asset name or Hugging Face hub id, resolved to a
folder; and a whole model config (``actor_rollout_ref.model``, SFT's ``model``) resolved once at
start-up, so every consumer (trainer ranks, servers, tokenizer, checkpoint export) loads the same
folders with the same options."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from trainer.models.hub import is_hub_id, resolve_hub_id
from trainer.models.registry import MODELS, prepare

if TYPE_CHECKING:
    from agentloop.tokenizer import TokenizerSource
    from trainer.config.actor import ModelConfig

from servers.user_code import import_external_lib

__all__ = [
    "import_external_lib",
    "read_chat_template",
    "resolve_model",
    "resolve_model_config",
    "tokenizer_source",
]

M = TypeVar("M", bound="ModelConfig")


def resolve_model(name_or_path: str, what: str = "--model", *, need_config: bool = True) -> str:
    """An ``agentloop-models`` asset name to its (prepared) cache folder; a folder path as is;
    a hub id (``org/name``) to its snapshot in the hub cache (``trainer.models.hub``).
    ``need_config``: a hub snapshot must hold ``config.json`` (False for a tokenizer).
    Raises ``ValueError`` naming ``what`` (the option or config key) otherwise."""
    if name_or_path in MODELS:
        return str(prepare(name_or_path))
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return str(path)
    if is_hub_id(name_or_path):
        return resolve_hub_id(name_or_path, what, need_config=need_config)
    known = ", ".join(sorted(MODELS))
    raise ValueError(
        f"{what} {name_or_path!r} is neither a model folder nor a known asset name ({known}) "
        "nor a Hugging Face hub id (org/name)"
    )


def read_chat_template(value: str | None, key: str) -> str | None:
    """The chat template text ``value`` gives: the value itself when it holds Jinja (``{{`` or
    ``{%``), else the contents of the file it names. Checked to compile."""
    if value is None:
        return None
    if "{{" in value or "{%" in value:
        text = value
    else:
        path = Path(value).expanduser()
        if not path.is_file():
            raise ValueError(
                f"{key}={value!r} is neither a Jinja chat template (it has no '{{{{' or '{{%') "
                "nor an existing template file: give the template text or a .jinja file's path"
            )
        text = path.read_text()
    from jinja2 import TemplateSyntaxError
    from transformers.utils.chat_template_utils import _compile_jinja_template

    try:
        _compile_jinja_template(text)  # the environment apply_chat_template renders with
    except TemplateSyntaxError as exc:
        raise ValueError(
            f"{key} is not a valid Jinja template (line {exc.lineno}: {exc.message}): fix it"
        ) from None
    return text


def resolve_model_config(model: M, prefix: str) -> M:
    """A copy of ``model`` whose ``path`` and ``tokenizer_path`` are local folders (the
    tokenizer's is the model's when unset) and whose ``custom_chat_template`` is template text,
    after importing ``external_lib``. Each problem is a ``ValueError`` naming
    ``{prefix}.<key>``. Call it once at start-up and hand the copy to every consumer."""
    import_external_lib(model.external_lib, f"{prefix}.external_lib")
    path = resolve_model(model.path, f"{prefix}.path")
    tokenizer = path
    if model.tokenizer_path is not None:
        tokenizer = resolve_model(
            model.tokenizer_path, f"{prefix}.tokenizer_path", need_config=False
        )
    template = read_chat_template(model.custom_chat_template, f"{prefix}.custom_chat_template")
    return dataclasses.replace(
        model, path=path, tokenizer_path=tokenizer, custom_chat_template=template
    )


def tokenizer_source(model: ModelConfig) -> TokenizerSource:
    """Where the policy's tokenizer loads from, for a config ``resolve_model_config`` made."""
    from agentloop.tokenizer import TokenizerSource

    return TokenizerSource(
        path=model.tokenizer_path or model.path,
        trust_remote_code=model.trust_remote_code,
        chat_template=model.custom_chat_template,
        external_lib=model.external_lib,
    )
