"""SGLang backend: the token-level contract over ``sglang.Engine`` (GPU only here).

Token ids in (``input_ids``, ``skip_tokenizer_init=True``), token ids and log-probs out
(``return_logprob=True``). SGLang names some sampling keys differently (``max_new_tokens``,
``min_new_tokens``, ``sampling_seed``); the adapter translates ours. Control calls go through
the engine's async ``tokenizer_manager`` because the engine's synchronous wrappers drive their
own event loop and hang inside a running one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from servers.config import ServerConfig
from servers.engine_args import check_known_args
from servers.types import EngineDeadError, GenerateRequest, SamplingParams, TokenOutput
from servers.weights import WeightSyncInfo

__all__ = ["SGLangEngine", "engine_args", "to_sglang_sampling", "from_sglang_output"]

logger = logging.getLogger(__name__)

_RENAMED = {"max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens", "seed": "sampling_seed"}


def to_sglang_sampling(params: SamplingParams | Mapping[str, Any]) -> dict[str, Any]:
    """Our sampling params (already validated) -> SGLang's ``sampling_params`` dict."""
    keys = SamplingParams.from_dict(params).to_dict()
    out = {_RENAMED.get(k, k): v for k, v in keys.items() if k != "logprobs"}
    if out.get("top_k") == 0:  # "no limit" is -1 in SGLang
        out["top_k"] = -1
    return out


def from_sglang_output(result: dict[str, Any], want_logprobs: bool = True) -> TokenOutput:
    """SGLang ``async_generate`` result -> ``TokenOutput``."""
    meta = result["meta_info"]
    token_ids = list(result["output_ids"])
    log_probs = None
    if want_logprobs:
        entries = meta.get("output_token_logprobs") or []
        log_probs = [float(e[0]) for e in entries]
        if len(log_probs) != len(token_ids):
            raise EngineDeadError(
                f"sglang returned {len(log_probs)} log-probs for {len(token_ids)} tokens"
            )
    reason = (meta.get("finish_reason") or {}).get("type", "abort")
    if reason not in ("stop", "length"):
        reason = "abort"
    return TokenOutput(token_ids=token_ids, log_probs=log_probs, finish_reason=reason)


def engine_args(cfg: ServerConfig) -> dict[str, Any]:
    """``sglang.Engine`` keyword arguments for ``cfg``: the server's own, then
    ``cfg.engine_kwargs`` (checked against SGLang's ``ServerArgs``)."""
    check_known_args("sglang", cfg.engine_kwargs)
    for name in ("max_num_batched_tokens", "enable_chunked_prefill"):
        if getattr(cfg, name) is not None:
            logger.warning(
                "%s is a vLLM setting and has no effect on SGLang: pass SGLang's own "
                "(chunked_prefill_size, max_prefill_tokens) in engine_kwargs",
                name,
            )
    args: dict[str, Any] = dict(
        model_path=cfg.model,
        trust_remote_code=cfg.trust_remote_code,
        dtype=cfg.dtype,
        tp_size=cfg.tensor_parallel_size,
        mem_fraction_static=cfg.gpu_memory_utilization,
        context_length=cfg.max_model_len,
        skip_tokenizer_init=True,
        enable_memory_saver=True,
        disable_radix_cache=not cfg.enable_prefix_caching,
        random_seed=cfg.seed,
    )
    if cfg.enforce_eager is not None:  # None: SGLang's default (CUDA graphs on)
        args["disable_cuda_graph"] = cfg.enforce_eager
    return {**args, **cfg.engine_kwargs}  # ServerConfig refused any overlap


class _BucketsOnly:
    """The weight side of an engine that takes named-tensor buckets only (SGLang here): it
    declares so, and the methods of the other kinds refuse (``AsyncServer`` never calls them,
    as they are not in ``weight_updates``)."""

    weight_updates: frozenset[str] = frozenset({"buckets"})
    adapter_root: Path | None = None
    scratch: Path | None = None

    def _refuse(self, kind: str) -> NotImplementedError:
        return NotImplementedError(
            f"{type(self).__name__} takes no {kind} weight updates: send BucketUpdate buckets"
        )

    async def load_staged(self, buckets: list[dict[str, Any]]) -> int:
        raise self._refuse("staged")

    async def load_adapter(self, tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> int:
        raise self._refuse("adapter")

    async def init_weight_transfer(self, init_info: dict[str, Any]) -> None:
        raise self._refuse("transfer")

    async def start_weight_transfer(self) -> None:
        raise self._refuse("transfer")

    async def transfer_weights(self, update_info: dict[str, Any]) -> None:
        raise self._refuse("transfer")

    async def finish_weight_transfer(self) -> None:
        raise self._refuse("transfer")

    async def shutdown_weight_transfer(self) -> None:
        raise self._refuse("transfer")


class SGLangEngine(_BucketsOnly):
    """Adapter with the same methods as ``VLLMEngine``. ``engine`` may be passed in (an
    already-built ``sglang.Engine``); otherwise ``start`` builds one from the config."""

    def __init__(self, config: ServerConfig, engine: Any | None = None) -> None:
        self.config = config
        self.engine = engine
        self.vocab_size = 0
        self.max_model_len = 0
        self._sleeping = False

    async def start(self) -> None:
        if self.config.lora_rank:
            logger.info(
                "lora_rank=%d: SGLang servers here load no adapters (weight_sync_info's "
                "lora_rank is 0), so they take the merged weights",
                self.config.lora_rank,
            )
        if self.engine is None:
            import sglang

            self.engine = sglang.Engine(**engine_args(self.config))
        tm = self.engine.tokenizer_manager
        self.vocab_size = int(tm.model_config.vocab_size)
        self.max_model_len = int(tm.context_len)

    async def generate(self, request: GenerateRequest) -> TokenOutput:
        """``request`` comes checked from ``ServerCore``. Its ``priority`` is not passed on:
        SGLang's priority scheduling is not wired here yet (fcfs)."""
        if self.engine is None:
            raise EngineDeadError("engine is not started")
        params = request.sampling_params
        want_logprobs = params.logprobs is not False
        result = await self.engine.async_generate(
            input_ids=request.prompt_ids,
            sampling_params=to_sglang_sampling(params),
            return_logprob=want_logprobs,
            rid=request.request_id,
        )
        return from_sglang_output(result, want_logprobs)

    async def abort(self, request_id: str) -> None:
        self.engine.tokenizer_manager.abort_request(rid=request_id)

    def openai(self) -> None:
        """No OpenAI serving layer here: the HTTP front's completion routes answer 501."""
        return None

    # ---- weights: tensors go straight to the scheduler (CUDA IPC handles on GPU) -------------
    async def begin_weight_update(self) -> None:
        begin = getattr(self.engine.tokenizer_manager, "begin_weight_update", None)
        if begin is not None:
            await begin()

    async def update_weights_bucket(self, named: Iterable[tuple[str, torch.Tensor]]) -> int:
        from sglang.srt.managers.io_struct import UpdateWeightsFromTensorReqInput
        from sglang.srt.utils import MultiprocessingSerializer

        named = list(named)
        request = UpdateWeightsFromTensorReqInput(
            serialized_named_tensors=[MultiprocessingSerializer.serialize(named)],
            load_format=None,
            flush_cache=False,
        )
        result = await self.engine.tokenizer_manager.update_weights_from_tensor(request, None)
        ok = result[0] if isinstance(result, tuple) else getattr(result, "success", True)
        if not ok:
            raise EngineDeadError(f"sglang rejected a weight bucket: {result}")
        return sum(t.numel() * t.element_size() for _, t in named)

    def weight_sync_info(self) -> WeightSyncInfo:
        """Named-tensor buckets only (``weight_updates``: no staged files, no LoRA adapters,
        no transfer API); the serving dtype
        where SGLang's model config shows it."""
        dtype = getattr(getattr(self.engine.tokenizer_manager, "model_config", None), "dtype", None)
        return WeightSyncInfo(
            backend="sglang",
            dtype=None if dtype is None else str(dtype).removeprefix("torch."),
            loads_staged=False,
            workers=self.config.tensor_parallel_size,
        )

    async def finish_weight_update(self) -> int:
        tm = self.engine.tokenizer_manager
        end = getattr(tm, "end_weight_update", None)
        if end is not None:
            await end()
        await tm.flush_cache()
        return 0

    # ---- memory -----------------------------------------------------------------------------
    async def sleep(self) -> None:
        from sglang.srt.managers.io_struct import ReleaseMemoryOccupationReqInput

        # Releasing memory while requests run kills the scheduler: callers drain first.
        await self.engine.tokenizer_manager.release_memory_occupation(
            ReleaseMemoryOccupationReqInput(), None
        )
        self._sleeping = True

    async def wake_up(self) -> None:
        from sglang.srt.managers.io_struct import ResumeMemoryOccupationReqInput

        await self.engine.tokenizer_manager.resume_memory_occupation(
            ResumeMemoryOccupationReqInput(), None
        )
        self._sleeping = False

    async def health(self) -> dict[str, Any]:
        if self.engine is None:
            raise EngineDeadError("engine is not started")
        return {
            "backend": "sglang",
            "model": self.config.model_name,
            "sleeping": self._sleeping,
            "max_model_len": self.max_model_len,
            "lora_version": 0,  # no adapters: LoRA trainers send merged weights
        }

    def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
