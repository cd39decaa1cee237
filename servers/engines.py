"""The engine adapter contract every backend implements, and the one place that picks a
backend from ``ServerConfig.backend`` (the backend modules import vLLM or SGLang, so they are
imported only when chosen)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import torch

from servers.config import ServerConfig
from servers.types import GenerateRequest, TokenOutput
from servers.weights import WeightSyncInfo

__all__ = ["EngineAdapter", "make_engine"]


class EngineAdapter(Protocol):
    """Everything ``ServerCore`` and ``AsyncServer`` call on an engine. The weight methods of
    a kind of update (``servers.updates``) are called only when the kind is in
    ``weight_updates``; a backend without the kind has them refuse (SGLang's)."""

    vocab_size: int
    max_model_len: int
    weight_updates: frozenset[str]
    """The kinds of weight update the backend takes: ``buckets`` always; vLLM also
    ``staged``, ``adapter``, ``transfer`` (refused by its own checks where the server's
    config does not allow them: LoRA off, ``weight_transfer=host``)."""
    adapter_root: Path | None
    """The folder the engine writes LoRA adapter versions into (None: none)."""
    scratch: Path | None
    """The folder the engine's processes keep their temporary files in (None: none)."""

    async def start(self) -> None: ...
    async def generate(self, request: GenerateRequest) -> TokenOutput:
        """``request`` is checked: its ``sampling_params`` validated and normalised by
        ``validate_request`` (``max_tokens`` and ``logprobs`` set) and its ``request_id``
        set; the adapter translates the params to its engine's. Lower ``priority`` is
        scheduled first where the engine supports it."""
        ...

    async def abort(self, request_id: str) -> None: ...
    def openai(self) -> Any | None:
        """The OpenAI chat/completions handlers of the HTTP front (None: they answer 501)."""
        ...

    # buckets
    async def begin_weight_update(self) -> None: ...
    async def update_weights_bucket(self, named: Iterable[tuple[str, torch.Tensor]]) -> int: ...
    async def finish_weight_update(self) -> int: ...
    # staged
    async def load_staged(self, buckets: list[dict[str, Any]]) -> int: ...
    # adapter
    async def load_adapter(
        self, tensors: dict[str, torch.Tensor], config: dict[str, Any]
    ) -> int: ...
    # transfer (vLLM's weight-transfer API)
    async def init_weight_transfer(self, init_info: dict[str, Any]) -> None: ...
    async def start_weight_transfer(self) -> None: ...
    async def transfer_weights(self, update_info: dict[str, Any]) -> None: ...
    async def finish_weight_transfer(self) -> None: ...
    async def shutdown_weight_transfer(self) -> None: ...

    def weight_sync_info(self) -> WeightSyncInfo:
        """Serving dtype, whether staged files load, the transfer backend, LoRA rank."""
        ...

    async def sleep(self) -> None: ...
    async def wake_up(self) -> None: ...
    async def health(self) -> dict[str, Any]: ...
    def shutdown(self) -> None: ...


def make_engine(config: ServerConfig) -> EngineAdapter:
    """The adapter for ``config.backend`` (not started: ``await engine.start()``)."""
    if config.backend == "vllm":
        from servers.vllm import VLLMEngine

        return VLLMEngine(config)
    from servers.sglang import SGLangEngine

    return SGLangEngine(config)
