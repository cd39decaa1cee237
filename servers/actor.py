"""``AsyncServer``: the Ray actor that owns one engine and its HTTP front.

Contract (DESIGN.md): ``generate(GenerateRequest) -> TokenOutput``,
``abort``, ``sleep``/``wake_up``, the weight-update methods, ``health``, ``address``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from typing import Any

import torch

from servers.config import ServerConfig
from servers.core import ServerCore
from servers.engines import make_engine
from servers.http import HttpFront, build_app
from servers.shm import SHM, engine_shm
from servers.types import GenerateRequest, TokenOutput
from servers.user_code import import_external_lib
from servers.weights import WeightSyncInfo, bucketize

__all__ = ["AsyncServer"]

logger = logging.getLogger(__name__)


class AsyncServer:
    """Plain class; ``ServerGroup`` wraps it with ``ray.remote``. Usable in-process too."""

    def __init__(self, config: ServerConfig | dict[str, Any]) -> None:
        self.config = config if isinstance(config, ServerConfig) else ServerConfig(**config)
        import_external_lib(self.config.external_lib)
        self.core = ServerCore(self.config, make_engine(self.config))
        self._http: HttpFront | None = None
        self._loads = {"staged": 0, "buckets": 0, "adapter": 0, "transfer": 0}
        """Weight updates this server loaded, by route (``weight_loads``)."""

    async def start(self) -> dict[str, Any]:
        """Start the engine (and HTTP front); returns ``health()``."""
        await self.core.start()
        if self.config.http:
            chat = completions = None  # the OpenAI routes answer 501 without a serving layer
            if hasattr(self.core.engine, "openai"):  # vLLM's
                api = self.core.engine.openai()
                chat, completions = api.chat, api.completions
            app = build_app(self.core, chat, completions)
            self._http = HttpFront(app, self.config.host, self.config.port)
            await self._http.start()
        return await self.health()

    async def generate(self, request: GenerateRequest) -> TokenOutput:
        """One turn; its ``request_id`` names the engine request (``abort``); lower
        ``priority`` is scheduled first (``scheduling_policy=priority``)."""
        return await self.core.generate(request)

    async def abort(self, request_id: str) -> None:
        await self.core.engine.abort(request_id)

    async def begin_weight_update(self) -> None:
        await self.core.engine.begin_weight_update()

    async def update_weights_bucket(self, named: list[tuple[str, torch.Tensor]]) -> int:
        return await self.core.engine.update_weights_bucket(named)

    async def finish_weight_update(self) -> int:
        loaded = await self.core.engine.finish_weight_update()
        self._loads["buckets"] += 1
        return loaded

    async def update_weights(
        self, named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = 256 << 20
    ) -> int:
        """All three steps for a full set of named tensors; returns tensors loaded."""
        await self.begin_weight_update()
        for bucket in bucketize(named, bucket_bytes):
            await self.update_weights_bucket(bucket)
        return await self.finish_weight_update()

    def weight_sync_info(self) -> WeightSyncInfo:
        """The serving dtype, how weights can reach the engine, and this server's node."""
        return dataclasses.replace(self.core.engine.weight_sync_info(), node_id=_node_id())

    async def load_staged_weights(self, buckets: list[dict], writer_node: str | None = None) -> int:
        """Load shared-memory buckets a sender on this node wrote itself
        (``StagedBucket.to_wire``); returns tensors loaded. ``writer_node``: the Ray node the
        files were written on; a file from another node is refused (its ``/dev/shm`` is not
        this one's, even where a test cluster's nodes share a machine)."""
        here = _node_id()
        if writer_node is not None and here is not None and writer_node != here:
            raise ValueError(
                f"staged weights written on node {writer_node} cannot be read on node {here}: "
                "a server on another node gets its weights in buckets"
            )
        loaded = await self._engine_with("load_staged").load_staged(buckets)
        self._loads["staged"] += 1
        return loaded

    async def load_adapter(self, tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> int:
        """Serve a new version of the LoRA adapter (a server started with ``lora_rank``):
        PEFT-named ``tensors`` and PEFT's ``adapter_config.json`` dict; returns its version.
        A restarted server begins again from ``lora_adapter_path`` (or the base model)."""
        version = await self._engine_with("load_adapter").load_adapter(tensors, config)
        self._loads["adapter"] += 1
        return version

    # vLLM's weight-transfer API (``weight_transfer=nccl|ipc``): a trainer drives these through
    # vLLM's trainer-side engine, which sends the tensors itself (NCCL broadcast / CUDA IPC).
    async def init_weight_transfer(self, init_info: dict[str, Any]) -> None:
        await self._engine_with("init_weight_transfer").init_weight_transfer(init_info)

    async def shutdown_weight_transfer(self) -> None:
        await self._engine_with("shutdown_weight_transfer").shutdown_weight_transfer()

    async def start_weight_transfer(self) -> None:
        await self._engine_with("start_weight_transfer").start_weight_transfer()

    async def transfer_weights(self, update_info: dict[str, Any]) -> None:
        await self._engine_with("transfer_weights").transfer_weights(update_info)

    async def finish_weight_transfer(self) -> None:
        await self._engine_with("finish_weight_transfer").finish_weight_transfer()
        self._loads["transfer"] += 1

    def weight_loads(self) -> dict[str, int]:
        """Weight updates loaded so far by route: ``staged`` (a shared-memory file written on
        this node), ``buckets`` (Ray objects), ``adapter`` (LoRA), ``transfer`` (vLLM's
        NCCL/IPC)."""
        return dict(self._loads)

    def _engine_with(self, method: str) -> Any:
        engine = self.core.engine
        if not hasattr(engine, method):
            raise NotImplementedError(
                f"{self.config.backend} servers have no {method}: send weights with "
                "begin_weight_update / update_weights_bucket / finish_weight_update"
            )
        return engine

    async def sleep(self) -> None:
        await self.core.engine.sleep()

    async def wake_up(self) -> None:
        await self.core.engine.wake_up()

    async def health(self) -> dict[str, Any]:
        """The engine's state (``lora_version``: the adapter version requests run on, 0 for
        none) and ``address``."""
        info = await self.core.engine.health()
        return {**info, "address": self.address()}

    def address(self) -> str | None:
        """Base URL of the HTTP front (None when it is off)."""
        return self._http.url if self._http else None

    def shm_footprint(self) -> dict[str, Any]:
        """``{"node_id", "names"}``: this server's Ray node (None outside Ray) and the
        ``/dev/shm`` entries its engine's processes map, and its LoRA adapter folder, which a
        kill would leave behind (``ServerGroup`` removes them after one)."""
        node_id = _node_id()
        names = engine_shm()
        adapters = getattr(self.core.engine, "adapter_root", None)  # vLLM with lora_rank
        if adapters is not None and adapters.parent == SHM:
            names.append(adapters.name)
        return {"node_id": node_id, "names": names}

    def metrics_text(self) -> str:
        return self.core.metrics.text().decode()

    async def shutdown(self) -> None:
        if self._http is not None:
            await self._http.stop()
            self._http = None
        self.core.engine.shutdown()


def _node_id() -> str | None:
    """This process's Ray node (None outside Ray)."""
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
