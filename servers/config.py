"""Typed configuration of one inference server: ``EngineConfig`` (the engine options a launcher
picks, the rollout config's ``engine`` node) and ``ServerConfig`` (those plus the model served
and the HTTP front)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from servers.engine_args import refuse_own_args
from servers.lora import check_lora

__all__ = [
    "SCHEDULING_POLICIES",
    "WEIGHT_TRANSFERS",
    "EngineConfig",
    "ServerConfig",
    "parse_cores",
]

SCHEDULING_POLICIES = ("priority", "fcfs")
"""Engine scheduling policies: lowest ``priority`` value first, or arrival order."""

WEIGHT_TRANSFERS = ("host", "nccl", "ipc")
"""How new weights reach an engine: through host memory, or vLLM's GPU weight-transfer API."""


def parse_cores(spec: str | int, key: str = "cpu_cores") -> list[int]:
    """``"0-3,6"`` -> ``[0, 1, 2, 3, 6]``, each checked against this machine's cores; a
    ``ValueError`` names ``key`` and what to write."""
    available = sorted(os.sched_getaffinity(0))
    cores: list[int] = []
    for part in str(spec).split(","):
        part = part.strip()
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                cores.extend(range(lo, hi + 1))
            else:
                cores.append(int(part))
        except ValueError:
            raise ValueError(
                f'{key}={spec!r} is not a core list: write e.g. "0", "0-3" or "0,2"'
            ) from None
    missing = sorted(set(cores) - set(available))
    if not cores or missing:
        raise ValueError(
            f"{key}={spec!r} names core(s) {missing or cores} this machine does not offer; "
            f"available: {available}"
        )
    return sorted(set(cores))


@dataclass(kw_only=True, slots=True)
class EngineConfig:
    """The engine options a launcher picks for a run, apart from the model served and the
    HTTP front: a rollout config holds one as its ``engine`` node and hands it to
    ``ServerConfig.of_engine`` as it is, so no field is copied by hand between the two.
    Checked where a ``ServerConfig`` is built (a launcher checks it earlier, naming its own
    keys)."""

    backend: Literal["vllm", "sglang"] = "vllm"
    """Inference engine behind the server."""
    tensor_parallel_size: int = 1
    """GPUs per engine (1 on CPU)."""
    gpu_memory_utilization: float = 0.5
    """Fraction of GPU memory the engine may take (weights + KV cache)."""
    max_model_len: int | None = None
    """Prompt + response token limit; None: the model's (a rollout derives it from its
    lengths: ``RolloutConfig.context_length``)."""
    enforce_eager: bool | None = None
    """Skip CUDA graphs / torch.compile (SGLang: ``disable_cuda_graph``); None means True on
    CPU (30 s vs 150 s start) and False on GPU (each engine's own default)."""
    cpu_cores: str | int | None = None
    """CPU only: the cores the engine runs on (``"0"``, ``"0-3"``, ``"0,2"``), so a trainer
    pinned to other cores does not compete with it; None: one thread per physical core
    the server may run on (``servers/cpu_layout.py``)."""
    scheduling_policy: str = "priority"
    """Order of waiting requests (``SCHEDULING_POLICIES``): ``priority`` runs the lowest
    ``priority`` value first (agent loops send their stragglers' turns with a lower one);
    ``fcfs``: arrival order."""
    max_num_seqs: int | None = None
    """Sequences the engine decodes at once; None: the engine's default. Turns wait (and the
    priority order matters) only once they are all taken; on the 2-core CPU benchmark a cap
    of 16 or 8 made rollout slower (docs/agent-loops.md#straggler-first-scheduling)."""
    max_num_batched_tokens: int | None = None
    """vLLM: tokens the engine schedules in one step (prompt chunks plus one per decoding
    sequence); None: the engine's default. Without chunked prefill it must hold the longest
    prompt (vLLM says so at start)."""
    enable_chunked_prefill: bool | None = None
    """vLLM: split a long prompt's prefill over steps, beside the decoding sequences; None: the
    engine's default for the model."""
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra arguments of the engine's constructor (vLLM ``AsyncEngineArgs``, ``sglang.Engine``),
    passed as they are. One the server sets itself from a field above (``model``,
    ``tensor_parallel_size``, ...) is refused naming that field; a name the engine does not
    take fails the server's start naming it (``servers/engine_args.py``)."""
    recompute_kv_after_weight_update: bool = False
    """In-flight weight updates (``async_training.partial_rollout=inflight``): the requests
    kept running through an update are preempted and their context prefilled again on the
    new weights (NeMo-RL's ``recompute_kv_cache_after_weight_updates``); False: their KV cache
    stays as the old weights computed it."""
    weight_transfer: str = "host"
    """How a trainer's weights reach the engine (``WEIGHT_TRANSFERS``). ``host``: through host
    memory (a shared-memory file the trainer writes when it shares the node, Ray objects
    otherwise); works on CPU and GPU, with either backend. vLLM on GPU only: ``nccl`` (vLLM's
    weight-transfer API; trainer rank 0 broadcasts from its GPU, nothing touches host memory)
    or ``ipc`` (CUDA IPC: for trainer ranks on the engine's own GPUs, i.e. colocated)."""


@dataclass(kw_only=True, slots=True)
class ServerConfig(EngineConfig):
    """One server: the model it serves, its engine options (``EngineConfig``) and its HTTP
    front."""

    model: str
    """Path of a Hugging Face model folder (use ``agentloop-models prepare`` for names)."""
    tokenizer: str | None = None
    """Tokenizer folder (None: the model folder's)."""
    trust_remote_code: bool = False
    """Let the engine (transformers) run code shipped with the model and tokenizer."""
    chat_template: str | None = None
    """Jinja chat template text the OpenAI chat endpoint renders with, replacing the
    tokenizer's own (None: keep it)."""
    external_lib: str | None = None
    """Module imported in the server's process before its engine starts (transformers
    registrations of a custom tokenizer or config). vLLM's engine processes are spawned and
    do not inherit it: an architecture the engine must build is registered from a vLLM
    plugin (``vllm.general_plugins`` entry point), which vLLM loads in each of them."""
    dtype: str = "auto"
    """Weights/activations dtype; ``auto`` is float32 on CPU (faster there) and the
    checkpoint's dtype on GPU."""
    enable_prefix_caching: bool = True
    """Reuse KV cache across turns of one trajectory."""
    cpu_kvcache_space_gib: int = 1
    """KV cache size on CPU (VLLM_CPU_KVCACHE_SPACE); without it vLLM tries to take ~all RAM."""
    logprobs_mode: str = "processed_logprobs"
    """Which log-probs the engine returns: ``processed_logprobs`` are under the sampling
    distribution (after temperature), what the trainer recomputes; ``raw_logprobs`` are before."""
    seed: int = 0
    """Engine seed."""
    lora_rank: int = 0
    """vLLM: the largest LoRA adapter rank the server loads (``load_adapter``); 0: LoRA off.
    The engine's ``max_lora_rank`` is the smallest value vLLM accepts at or above it (1, 8, 16,
    32, 64, 128, 256, 320, 512). Every request then runs on the adapter loaded last. SGLang
    servers load no adapters (``weight_sync_info().lora_rank`` is 0): they take merged weights."""
    max_loras: int = 2
    """vLLM, with ``lora_rank``: adapter versions the engine runs in one batch. 2: the one
    loaded last and the one before it, whose requests may still run."""
    lora_adapter_path: str | None = None
    """vLLM, with ``lora_rank``: a PEFT adapter folder (``adapter_config.json`` +
    ``adapter_model.safetensors``) the server loads before it serves; None: the base model."""
    served_model_name: str | None = None
    """Model name on the OpenAI endpoint; defaults to the folder name."""
    tool_parser: str = "hermes"
    """Tool-call parser of the OpenAI chat endpoint (Hermes/Qwen ``<tool_call>`` JSON)."""
    host: str = "127.0.0.1"
    """HTTP bind address; loopback unless you mean to expose the server."""
    port: int = 0
    """HTTP port; 0 picks a free one."""
    http: bool = True
    """Start the HTTP front (OpenAI chat, completions and models, /generate, /health,
    /metrics)."""
    api_key: str | None = field(default=None, repr=False)
    """Bearer token the HTTP front requires on every route but ``GET /health``
    (``Authorization: Bearer <key>``); None reads ``AGENTLOOP_API_KEY`` from the environment,
    and neither set means no auth. Ray calls to the actor are not affected."""
    max_concurrent_requests: int = 256
    """Requests admitted at once over HTTP (``/generate``, ``/v1/chat/completions``,
    ``/v1/completions``), counted in sequences: a chat request with ``n`` choices counts as
    ``n``, a completion request ``n`` per prompt. One that does not fit gets 503 with
    ``Retry-After`` (no waiting queue). Ray calls to the actor are not counted."""
    max_n: int = 64
    """Most choices (``n``) one chat request, or one prompt of a completion request, may ask
    for over HTTP; more is a 400 naming this limit. Enough for a GRPO group; ``/generate``
    samples one sequence per request."""
    max_tokens_per_request: int = 32768
    """Largest ``max_tokens`` (chat: also ``max_completion_tokens``) one HTTP request may ask
    for, per sequence; more is a 400. Below it, ``max_tokens`` is still clamped to the room the
    model length leaves after the prompt."""
    max_prompt_tokens: int | None = None
    """Longest prompt one HTTP request may send, in tokens (``/generate``: ``prompt_ids``;
    chat: after the chat template; completions: each prompt once tokenized); more is a 400.
    None: only the model length bounds it."""

    @classmethod
    def of_engine(cls, engine: EngineConfig, **rest: Any) -> ServerConfig:
        """A server with ``engine``'s options, each field as it is, and ``rest`` (the model it
        serves, its front, and any engine field a launcher derives, e.g. ``max_model_len``)."""
        values = {f.name: getattr(engine, f.name) for f in dataclasses.fields(EngineConfig)}
        return cls(**{**values, **rest})

    @property
    def model_name(self) -> str:
        """Name the server answers to: ``served_model_name``, else the hub id of a hub-cache
        snapshot (``.../models--Org--Name/snapshots/<commit>`` answers to ``Org/Name``), else
        the model folder's name."""
        if self.served_model_name:
            return self.served_model_name
        path = Path(self.model)
        repo = path.parent.parent.name
        if path.parent.name == "snapshots" and repo.startswith("models--"):
            return repo.removeprefix("models--").replace("--", "/")
        return path.name

    def __post_init__(self) -> None:
        if self.backend not in ("vllm", "sglang"):
            raise ValueError(f"backend must be 'vllm' or 'sglang', got {self.backend!r}")
        if self.tensor_parallel_size < 1:
            raise ValueError("tensor_parallel_size must be >= 1")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError("max_model_len must be >= 2 (or None for the model's)")
        if self.cpu_kvcache_space_gib < 1:
            raise ValueError("cpu_kvcache_space_gib must be >= 1 GiB")
        if self.logprobs_mode not in ("processed_logprobs", "raw_logprobs"):
            raise ValueError("logprobs_mode must be 'processed_logprobs' or 'raw_logprobs'")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(
                f"scheduling_policy must be 'priority' or 'fcfs', got {self.scheduling_policy!r}"
            )
        if self.max_num_seqs is not None and self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1 (or None), got {self.max_num_seqs}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens must be >= 1 (or None), got {self.max_num_batched_tokens}"
            )
        refuse_own_args(self.backend, self.engine_kwargs)
        check_lora(self.lora_rank, self.lora_adapter_path)
        if self.max_loras < 1:
            raise ValueError(f"max_loras must be >= 1, got {self.max_loras}")
        if self.lora_adapter_path is not None and self.backend != "vllm":
            raise ValueError(
                f"lora_adapter_path: {self.backend} servers load no LoRA adapters here; use "
                "backend='vllm', or leave it unset and send the merged weights"
            )
        if self.weight_transfer not in WEIGHT_TRANSFERS:
            raise ValueError(
                f"weight_transfer must be 'host', 'nccl' or 'ipc', got {self.weight_transfer!r}"
            )
        if self.weight_transfer != "host" and self.backend != "vllm":
            raise ValueError(
                f"weight_transfer={self.weight_transfer!r} is vLLM's weight-transfer API: use "
                f"backend='vllm', or weight_transfer='host' with {self.backend}"
            )
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.api_key is None:
            self.api_key = os.environ.get("AGENTLOOP_API_KEY") or None
        elif not self.api_key.strip():
            raise ValueError("api_key must be a non-empty string (None turns auth off)")
        if self.max_concurrent_requests < 1:
            raise ValueError(
                f"max_concurrent_requests must be >= 1, got {self.max_concurrent_requests}"
            )
        for key in ("max_n", "max_tokens_per_request"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise ValueError(
                f"max_prompt_tokens must be >= 1 (or None for the model length), got "
                f"{self.max_prompt_tokens}"
            )
        if self.cpu_cores is not None:
            parse_cores(self.cpu_cores)
