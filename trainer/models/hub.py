"""Hugging Face hub ids (``org/name``) resolved to a local snapshot folder, as transformers and
vLLM users expect, once at start-up; every consumer then loads that folder.

The folder comes from huggingface_hub's cache (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
``~/.cache/huggingface/hub``). With ``HF_HUB_OFFLINE=1`` (or ``TRANSFORMERS_OFFLINE=1``) no
network is attempted: a model missing from the cache is an error naming the folder searched.
Online, the snapshot is downloaded (or updated); a download that fails, e.g. with no network,
falls back to the cached snapshot as huggingface_hub does.

The environment is read at each call: huggingface_hub reads it once, when it is imported, so a
launcher or a test that sets ``HF_HOME`` afterwards would otherwise be ignored.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from trainer.models.errors import HubModelError

__all__ = [
    "HUB_IGNORE_PATTERNS",
    "TOKENIZER_PATTERNS",
    "hub_cache_dir",
    "hub_offline",
    "is_hub_id",
    "resolve_hub_id",
]

logger = logging.getLogger(__name__)

HUB_IGNORE_PATTERNS = [
    "original/*",  # Meta's consolidated checkpoints beside the HF weights
    "*.pth",
    "*.gguf",
    "*.h5",
    "*.msgpack",
    "*.onnx",
    "onnx/*",
    "*.ot",
    "*.tflite",
    "openvino/*",
    "coreml/*",
]
"""Files of a hub repository no loader here reads (other frameworks' weights): not downloaded."""

TOKENIZER_PATTERNS = [
    "tokenizer*",
    "vocab*",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template*",
    "*.model",  # sentencepiece
    "*.tiktoken",
    "config.json",  # AutoTokenizer reads the model type from it
    "generation_config.json",
    "*.py",  # a tokenizer's remote code (trust_remote_code)
]
"""The only files downloaded when just a tokenizer is needed (``need_config=False``): its
files and chat template, never the weights."""

_TRUE = {"1", "ON", "YES", "TRUE"}


def is_hub_id(name: str) -> bool:
    """``org/name`` as the hub spells a repository id (one slash, letters, digits, ``-_.``)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if name.count("/") != 1:
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def hub_cache_dir() -> Path:
    """The hub cache huggingface_hub uses under the current environment."""
    env = os.environ
    cache = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    if cache:
        return Path(os.path.expandvars(cache)).expanduser().absolute()
    home = env.get("HF_HOME") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface"
    )
    return Path(os.path.expandvars(home)).expanduser().absolute() / "hub"


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` (or the older ``TRANSFORMERS_OFFLINE``) is set to a true value."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in _TRUE


def resolve_hub_id(repo_id: str, what: str, *, need_config: bool = True) -> str:
    """The local snapshot folder of hub model ``repo_id`` (downloaded unless offline).

    ``what`` names the option or config key in errors. ``need_config``: the snapshot must hold
    ``config.json`` (a model, not just its tokenizer); without it only ``TOKENIZER_PATTERNS``
    are downloaded. Raises ``HubModelError`` (a ``ValueError``) saying what to do."""
    from huggingface_hub import errors, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    # A subclass of LocalEntryNotFoundError in huggingface_hub >= 1.22; older ones lack it.
    incomplete: type[Exception] | None = getattr(errors, "IncompleteSnapshotError", None)

    cache = hub_cache_dir()
    offline = hub_offline()
    searched = cache / f"models--{repo_id.replace('/', '--')}"
    fix = (
        f"download it into this cache where a hub is reachable (`hf download {repo_id}`), "
        f"or set {what} to a local model folder"
    )
    try:
        folder = snapshot_download(
            repo_id,
            cache_dir=cache,
            local_files_only=offline,
            endpoint=os.environ.get("HF_ENDPOINT") or None,
            allow_patterns=None if need_config else TOKENIZER_PATTERNS,
            ignore_patterns=HUB_IGNORE_PATTERNS,
        )
    except LocalEntryNotFoundError as exc:
        if incomplete is not None and isinstance(exc, incomplete):
            reason = str(exc).splitlines()[0]
            raise HubModelError(
                f"{what} {repo_id!r}: the cached snapshot under {searched} is incomplete "
                f"({reason}); {fix}"
            ) from None
        if offline:
            why = "HF_HUB_OFFLINE=1 allows no download"
        else:
            cause = exc.__cause__ or exc
            why = f"downloading it failed: {type(cause).__name__}: {cause}".splitlines()[0]
        raise HubModelError(
            f"{what} {repo_id!r} is a Hugging Face hub id that is not in the hub cache "
            f"(searched {searched}) and {why}: {fix}"
        ) from None
    except HfHubHTTPError as exc:  # unknown or gated repository, bad token, ...
        reason = " ".join(line for line in str(exc).splitlines()[:3] if line)
        raise HubModelError(
            f"{what} {repo_id!r}: the hub refused it ({reason}): check the id, log in "
            f"(`hf auth login`) for a gated model, or set {what} to a local model folder"
        ) from None
    path = Path(folder).absolute()
    if need_config and not (path / "config.json").is_file():
        raise HubModelError(
            f"{what} {repo_id!r}: the cached snapshot {path} has no config.json (only part of "
            f"the repository is cached, e.g. its tokenizer); {fix}"
        )
    logger.info("%s %s: hub snapshot %s", what, repo_id, path)
    return str(path)
