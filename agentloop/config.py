"""Typed configs of the rollout side (``actor_rollout_ref.rollout``) and a strict builder that
turns a plain dict (e.g. from Hydra/YAML) into nested dataclasses with clear errors.

Each component gets its own node: the agent loops' (``multi_turn``, ``agent``, ``trace``,
``gateway``, ...) here, the servers' engine options as ``engine`` (``servers.EngineConfig``).
verl's key names (its flat server keys, its other spellings, keys with no effect here) are
handled at the edge, by ``trainer.config.verl`` (docs/verl-migration.md).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from servers.config import SCHEDULING_POLICIES, WEIGHT_TRANSFERS, EngineConfig
from servers.placement import check_resource_name

__all__ = [
    "COMPACTION_MODES",
    "AgentConfig",
    "CompactionConfig",
    "GatewayConfig",
    "MultiTurnConfig",
    "RecoveryConfig",
    "RolloutConfig",
    "TraceConfig",
    "UserModelConfig",
    "ValKwargsConfig",
    "from_dict",
]


@dataclass(kw_only=True, slots=True)
class UserModelConfig:
    """The model a ``SimulatedUser`` interaction talks through: its own server group, started
    by the trainer beside the rollout servers (as the judge's is)."""

    model_path: str | None = None
    """The user's model (a folder or an agentloop-models asset name); None: no user model."""
    num_servers: int = 1
    tensor_model_parallel_size: int = 1
    gpu_memory_utilization: float = 0.3
    max_model_len: int = 4096
    node_resource: str | None = None
    """A custom Ray resource of the nodes that run the user model's servers (docs/cluster.md);
    None: any node."""

    def __post_init__(self) -> None:
        check_resource_name(self.node_resource, "multi_turn.user_model.node_resource")
        if self.num_servers < 1:
            raise ValueError(
                f"multi_turn.user_model.num_servers must be >= 1, got {self.num_servers}"
            )
        if self.max_model_len < 16:
            raise ValueError("multi_turn.user_model.max_model_len must be >= 16")


COMPACTION_MODES = ("drop_tool_outputs", "summarize")
"""How ``tool_agent`` compacts a history that reached ``multi_turn.max_context_tokens``."""

DROPPED_TOOL_OUTPUT = "[tool output dropped to fit the context]"

SUMMARY_PROMPT = (
    "Your context is almost full and will be cleared. Write a summary for yourself to continue "
    "from: the task, what you found, what you changed, what failed, and what is left to do. "
    "Do not call a tool."
)

SUMMARY_HEADER = "Summary of your work so far (your earlier context was cleared):\n"


@dataclass(kw_only=True, slots=True)
class CompactionConfig:
    """How ``tool_agent`` compacts a sample's history when its next model call would pass
    ``multi_turn.max_context_tokens`` (docs/repo-tasks.md, "Context compaction")."""

    mode: Literal["drop_tool_outputs", "summarize"] = "drop_tool_outputs"
    """``drop_tool_outputs``: every tool output but the newest ``keep`` is replaced by
    ``placeholder`` (the model's own turns and the prompt stay as they were).
    ``summarize``: the policy itself writes a summary of the history (a model turn of the
    segment that closes, trained like any other), and the next segment's prompt is the row's
    prompt with ``summary_header`` + the summary added to its last user message."""
    keep: int = 1
    """``drop_tool_outputs``: newest tool outputs a compaction keeps whole (0: drop them all)."""
    placeholder: str = DROPPED_TOOL_OUTPUT
    """The text a dropped tool output is replaced with (``summarize``: the outputs of a last
    turn too long to summarize with, which then follow the summary whole)."""
    summary_tokens: int = 256
    """``summarize``: the most tokens the summary may take. Every model call leaves room for
    it (and for ``summary_prompt``) inside ``max_context_tokens``."""
    summary_prompt: str = SUMMARY_PROMPT
    """``summarize``: the user message that asks the policy for its summary."""
    summary_header: str = SUMMARY_HEADER
    """``summarize``: the text before the summary in the next segment's prompt."""

    def __post_init__(self) -> None:
        if self.mode not in COMPACTION_MODES:
            raise ValueError(
                f"multi_turn.compaction.mode must be one of {', '.join(COMPACTION_MODES)}, "
                f"got {self.mode!r}"
            )
        if isinstance(self.keep, bool) or not isinstance(self.keep, int) or self.keep < 0:
            raise ValueError(f"multi_turn.compaction.keep must be an int >= 0, got {self.keep!r}")
        tokens = self.summary_tokens
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
            raise ValueError(
                f"multi_turn.compaction.summary_tokens must be an int >= 1, got {tokens!r}"
            )
        if self.mode == "summarize" and not self.summary_prompt.strip():
            raise ValueError(
                "multi_turn.compaction.summary_prompt must not be empty with mode=summarize: it "
                "is the message that asks the policy for its summary"
            )


@dataclass(kw_only=True, slots=True)
class MultiTurnConfig:
    max_assistant_turns: int | None = None
    """Stop after this many model turns (None: only the response budget stops it)."""
    max_user_turns: int | None = None
    """Stop after this many tool/user turns appended (None: no limit)."""
    max_parallel_calls: int = 1
    """Tool calls run per model turn; extra calls get an error message instead of running."""
    max_tool_response_length: int = 256
    """Characters of a tool response kept (the rest is cut on ``tool_response_truncate_side``)."""
    tool_response_truncate_side: Literal["left", "middle", "right"] = "middle"
    """Which part is cut: ``right`` keeps the start, ``left`` keeps the end, ``middle`` both."""
    tool_timeout_s: float = 30.0
    """Wall-clock limit of one tool call; past it the model sees a timeout error."""
    max_concurrent_tool_calls: int | None = None
    """Tool calls in flight per AgentLoopWorker over all samples (None: no limit). A tool's
    own ``config.max_concurrency`` limits that tool."""
    tool_config_path: str | None = None
    """verl-layout tool YAML (``tools: [{class_name, config, tool_schema}]``)."""
    interaction_config_path: str | None = None
    """verl-layout interaction YAML (``interaction: [{name, class_name, config}]``): simulated
    users that answer each tool_agent turn that calls no tool (docs/interactions.md); a row
    picks one with ``extra_info.interaction_kwargs.name``."""
    interaction_timeout_s: float = 120.0
    """Wall-clock limit of one interaction call; past it the sample fails (recorded, weight 0)
    and the rest of the batch goes on."""
    user_model: UserModelConfig = field(default_factory=UserModelConfig)
    """The server group of model-backed simulated users (``SimulatedUser``)."""
    format: str | None = None
    """The model family's chat format (``agentloop.registered_formats()``): tool-call syntax,
    end-of-turn tokens, history messages. ``hermes``/``qwen`` (Qwen2.5, Qwen3),
    ``llama3_json`` (Llama 3.1-3.3), ``mistral`` (v3 tool results), ``mistral_v7`` (v7+:
    results as given), ``gpt-oss``, ``glm45``, ``glm47``; None: derived from the chat template
    at start-up (hermes when no family matches); a template of a later version of the named
    family (``mistral`` -> ``mistral_v7``, ``glm45`` -> ``glm47``) picks that version."""
    delta_check: Literal["suffix", "full"] = "suffix"
    """How template deltas are rendered: ``suffix`` renders only the prompt, the last model
    turn and the new messages (cost flat in history length; exact on the registered
    families' templates); ``full`` renders the whole conversation each turn and also checks
    that the suffix path agrees (for a custom template whose new messages depend on more)."""
    max_tokens_per_turn: int | None = None
    """Tokens one model turn may sample (None: whatever is left of response_length)."""
    repair_tool_calls: bool = True
    """Parse tool-call JSON leniently (trailing commas, single quotes, Python literals,
    unclosed braces are repaired; logged as ``agent_loop/repaired_calls``). The served
    endpoint parses strictly, so a model can learn to lean on repair its deployment lacks:
    False makes such a call a ``bad_json`` error the model sees, as it would when served."""
    max_context_tokens: int | None = None
    """Context budget of a ``tool_agent`` sample (None: off, no compaction). Before each
    model call, the segment's prompt + response so far + the turn about to be appended
    (tool or user messages) + ``max_tokens_per_turn`` must fit the smallest of this, the
    engine's context length and the segment's prompt + ``response_length``; when it would
    not, the history is compacted (``compaction``) and the sample goes on as a new segment,
    a training sample of its own whose prompt is the compacted history. Needs
    ``max_tokens_per_turn`` (the room the next turn is given)."""
    compaction: CompactionConfig = field(default_factory=CompactionConfig)
    """How a history that reached ``max_context_tokens`` is compacted."""

    def __post_init__(self) -> None:
        for name in ("max_assistant_turns", "max_user_turns"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"multi_turn.{name} must be >= 1 or null, got {value}")
        if self.max_parallel_calls < 1:
            raise ValueError(
                f"multi_turn.max_parallel_calls must be >= 1, got {self.max_parallel_calls}"
            )
        if self.max_tool_response_length < 1:
            raise ValueError("multi_turn.max_tool_response_length must be >= 1")
        if self.max_concurrent_tool_calls is not None and self.max_concurrent_tool_calls < 1:
            raise ValueError("multi_turn.max_concurrent_tool_calls must be >= 1 or null")
        if self.tool_timeout_s <= 0:
            raise ValueError("multi_turn.tool_timeout_s must be > 0")
        if self.interaction_timeout_s <= 0:
            raise ValueError("multi_turn.interaction_timeout_s must be > 0")
        if self.max_tokens_per_turn is not None and self.max_tokens_per_turn < 1:
            raise ValueError("multi_turn.max_tokens_per_turn must be >= 1 or null")
        self._check_context_budget()

    def _check_context_budget(self) -> None:
        budget = self.max_context_tokens
        if budget is None:
            return
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise ValueError(f"multi_turn.max_context_tokens must be >= 1 or null, got {budget!r}")
        if self.max_tokens_per_turn is None:
            raise ValueError(
                "multi_turn.max_context_tokens needs multi_turn.max_tokens_per_turn: the room "
                "the next model turn is given (the history is compacted when the context plus "
                "it would pass max_context_tokens)"
            )
        if self.max_tokens_per_turn >= budget:
            raise ValueError(
                f"multi_turn.max_tokens_per_turn={self.max_tokens_per_turn} must be < "
                f"multi_turn.max_context_tokens={budget}"
            )
        summary = self.compaction.summary_tokens
        if self.compaction.mode == "summarize" and self.max_tokens_per_turn + summary >= budget:
            raise ValueError(
                f"multi_turn.max_tokens_per_turn={self.max_tokens_per_turn} + "
                f"multi_turn.compaction.summary_tokens={summary} must be < "
                f"multi_turn.max_context_tokens={budget}: with mode=summarize every model call "
                "leaves room for the summary"
            )


@dataclass(kw_only=True, slots=True)
class AgentConfig:
    num_workers: int = 1
    """AgentLoopWorker Ray actors the batch is split over."""
    agent_loop_config_path: str | None = None
    """YAML list of user loops ``[{name, _target_, ...kwargs}]``."""
    default_agent_loop: str | None = None
    """Loop for rows without an ``agent_name`` field; None: ``tool_agent`` when
    ``multi_turn.interaction_config_path`` is set (the simulated user needs a multi-turn loop),
    else ``single_turn_agent``."""
    node_resource: str | None = None
    """A custom Ray resource of the nodes that run the agent-loop workers, and with them the
    tools, MCP servers and sandboxes (docs/cluster.md); None: any node."""

    def __post_init__(self) -> None:
        check_resource_name(self.node_resource, "agent.node_resource")
        if self.num_workers < 1:
            raise ValueError(f"agent.num_workers must be >= 1, got {self.num_workers}")


@dataclass(kw_only=True, slots=True)
class GatewayConfig:
    """The session gateway: agents written with the OpenAI SDK (or any framework over it)
    call an OpenAI-compatible endpoint per rollout session (docs/gateway.md)."""

    host: str = "127.0.0.1"
    """Address each agent-loop worker's gateway listens on (0.0.0.0 for agents on other
    machines)."""
    port: int = 0
    """Port of the gateway; 0: a free port per worker."""
    api_key: str | None = None
    """Bearer key agents must send; None: any key (agents still get one to pass on)."""
    max_calls_per_session: int = 64
    """Model calls one session may make; the next gets a 400 naming this key."""
    max_tokens_per_session: int | None = None
    """Tokens one session may sample over all its calls (None: only each segment's
    response_length); past it a call gets a 400 naming this key."""
    agent_sets_temperature: bool = False
    """Let a call's ``temperature``/``top_p`` replace the rollout's (off: the rollout's
    sampling holds, as the samples must come from the policy being trained)."""
    role_from_model: bool = False
    """Each segment's role is the ``model`` field of its first request (a planner and an
    executor one model plays): the group estimators then compare samples within (prompt,
    role). Off: one role."""
    segment_weight: Literal["session", "segment"] = "session"
    """``session``: a session's k segments weigh 1/k each, so a session counts once in its
    group and in the loss; ``segment``: each segment counts as a sample of its own."""
    on_agent_error: Literal["zero_reward", "drop"] = "zero_reward"
    """A session whose agent raised, exited non-zero or ran past its time limit: reward 0
    (``zero_reward``) or left out of the group and the loss (``drop``, weight 0)."""
    agent_timeout_s: float = 600.0
    """Wall-clock limit of one session's agent; past it the agent is cancelled (in-process)
    or killed (command) and the session counts as failed."""
    log_dir: str | None = None
    """Where command agents' rows, stdout and stderr are kept, a folder per session (None:
    ``<trainer.default_local_dir>/gateway`` in training, else a temporary folder)."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"rollout.gateway.port must be in 0..65535, got {self.port}")
        if self.max_calls_per_session < 1:
            raise ValueError("rollout.gateway.max_calls_per_session must be >= 1")
        if self.max_tokens_per_session is not None and self.max_tokens_per_session < 1:
            raise ValueError("rollout.gateway.max_tokens_per_session must be >= 1 or null")
        if self.agent_timeout_s <= 0:
            raise ValueError("rollout.gateway.agent_timeout_s must be > 0")

    def segment_weight_of(self, segments: int) -> float:
        """Each of a sample's ``segments`` training samples' weight: 1/k of the sample
        (``segment_weight=session``) or 1 (``segment``). Gateway sessions and compacted
        ``tool_agent`` samples are weighted alike."""
        return 1.0 / segments if self.segment_weight == "session" else 1.0


@dataclass(kw_only=True, slots=True)
class TraceConfig:
    backend: Literal["mlflow"] | None = None
    """``mlflow``: one MLflow trace per traced sample; None: tracing off (no cost)."""
    token2text: bool = False
    """Put decoded text (prompt tail, each turn, the response) into the spans."""
    max_samples_per_step_per_worker: int | None = None
    """Samples traced per step by each AgentLoopWorker (its first ones); None: all."""
    tracking_uri: str | None = None
    """None: ``MLFLOW_TRACKING_URI``, or the training run's store (set by the trainer)."""
    experiment_name: str | None = None
    """None: the training run's experiment (``trainer.project_name``), else agentloop-rollouts."""
    run_id: str | None = None
    """The MLflow run the traces are linked to (set by the trainer when it logs to mlflow)."""

    def __post_init__(self) -> None:
        n = self.max_samples_per_step_per_worker
        if n is not None and n < 0:
            raise ValueError("trace.max_samples_per_step_per_worker must be >= 0 (or null)")


@dataclass(kw_only=True, slots=True)
class RecoveryConfig:
    """What the rollout does when a server dies."""

    health_check_interval_s: float = 5.0
    """How often the driver checks its servers while a batch runs; a dead one is restarted
    (and given the current weights) while the others go on."""
    max_server_restarts: int = 3
    """Server restarts allowed over the run; a death after that stops it with a clear error."""
    restart_wait_s: float = 600.0
    """How long a turn waits for a restarted server when no server is healthy."""

    def __post_init__(self) -> None:
        if self.health_check_interval_s <= 0 or self.restart_wait_s < 0:
            raise ValueError(
                "rollout.recovery needs health_check_interval_s > 0 and restart_wait_s >= 0"
            )
        if self.max_server_restarts < 0:
            raise ValueError("rollout.recovery.max_server_restarts must be >= 0")


@dataclass(kw_only=True, slots=True)
class ValKwargsConfig:
    """Sampling of validation rollouts (verl's ``rollout.val_kwargs``): greedy by default
    (temperature 0). As in verl's agent loops, the turns sample with ``temperature``,
    ``top_p`` and ``top_k`` whatever ``do_sample`` says; ``warnings()`` names a ``do_sample``
    that disagrees with the temperature, and ``n > 1`` greedy copies (the trainer logs them
    once at start-up)."""

    top_k: int = -1
    """-1: no top-k limit."""
    top_p: float = 1.0
    temperature: float = 0.0
    """0: greedy."""
    n: int = 1
    """Responses per validation prompt (``val-core/<data_source>/reward/mean@<n>``)."""
    do_sample: bool = False
    """verl's switch; agent loops follow ``temperature`` (a disagreeing value warns)."""

    def __post_init__(self) -> None:
        key = "rollout.val_kwargs"
        if self.n < 1:
            raise ValueError(f"{key}.n must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"{key}.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"{key}.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k != -1 and self.top_k < 1:
            raise ValueError(f"{key}.top_k must be -1 (no limit) or >= 1, got {self.top_k}")

    def warnings(self) -> list[str]:
        """Settings that do not do what they say (accepted, as verl accepts them)."""
        key = "rollout.val_kwargs"
        greedy = self.temperature == 0
        out = []
        if self.do_sample == greedy:
            out.append(
                f"{key}.do_sample={str(self.do_sample).lower()} has no effect: validation "
                f"follows {key}.temperature={self.temperature:g} ("
                f"{'greedy' if greedy else 'sampled'}), as verl's agent loops do"
            )
        if greedy and self.n > 1:
            out.append(
                f"{key}.n={self.n} at temperature 0 validates {self.n} identical greedy "
                f"responses per prompt: set {key}.temperature > 0 to sample them, or n=1"
            )
        return out

    def sampling_params(self) -> dict[str, Any]:
        """Sampling keys of a validation turn."""
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}


@dataclass(kw_only=True, slots=True)
class RolloutConfig:
    """``actor_rollout_ref.rollout``: what the agent loops read (sampling, lengths,
    ``multi_turn``, ``agent``, ``trace``, ``gateway``, ``val_kwargs``), the rollout servers'
    group (``num_servers``, ``node_resource``, ``recovery``) and their ``engine`` node, which
    ``servers/`` reads as it is (``ServerConfig.of_engine``)."""

    mode: str = "async"
    """Only ``async`` (server-based agent loops) exists."""
    n: int = 1
    """Samples per prompt (GRPO group size)."""
    temperature: float = 1.0
    """Sampling temperature of every turn."""
    top_p: float = 1.0
    top_k: int = -1
    """-1: no top-k limit."""
    prompt_length: int = 1024
    """Prompt tokens kept per sample (left-padded to this)."""
    response_length: int = 512
    """Response budget over all turns, tool tokens included (right-padded to this)."""
    num_servers: int | None = None
    """AsyncServer actors (data-parallel engines). None: as verl, one per tensor-parallel group
    of the trainer's GPUs on CUDA (trainer.nnodes x trainer.n_gpus_per_node //
    tensor_model_parallel_size, at least 1); one on CPU, where an engine is a whole process
    that already uses every core it is given, so a second would only share them."""
    node_resource: str | None = None
    """A custom Ray resource the rollout servers' nodes declare (``ray start
    --resources='{"rollout": 1}'``): servers start, and restart after a node is lost, only
    there (docs/cluster.md); None: any node with the CPUs/GPUs a server asks for."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    """The rollout servers' engine options, read by ``servers/`` as they are
    (``servers.EngineConfig``); verl's flat keys (``rollout.name``,
    ``rollout.tensor_model_parallel_size``, ``rollout.gpu_memory_utilization``, ...) set them
    (``trainer.config.verl.keys``). ``max_model_len`` None: ``prompt_length +
    response_length`` (``context_length``); ``cpu_cores`` with the trainer ranks on other cores
    (``actor.cpu_cores``) makes rollout and training overlap for real; ``engine_kwargs`` is
    verl's ``engine_kwargs.<name>`` table of the running backend."""
    lora_sync: str = "adapter"
    """How a LoRA actor's weights (``actor_rollout_ref.model.lora_rank > 0``) reach vLLM
    servers in training: ``adapter`` (servers run with LoRA and load each new adapter
    version: megabytes per sync, the engine's LoRA kernels in every forward) or ``merged``
    (servers run without LoRA and get the full weights with the adapter merged in: the whole
    model per sync, no LoRA cost in generation; on CPU the faster step, docs/training.md)."""
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra chat-template variables, e.g. ``{enable_thinking: false}`` for Qwen3."""
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    trace: TraceConfig = field(default_factory=TraceConfig)
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    val_kwargs: ValKwargsConfig = field(default_factory=ValKwargsConfig)
    """Sampling of validation rollouts (greedy by default, as verl)."""

    def __post_init__(self) -> None:
        check_resource_name(self.node_resource, "actor_rollout_ref.rollout.node_resource")
        if self.mode != "async":
            raise ValueError(
                f"actor_rollout_ref.rollout.mode={self.mode!r} is not supported: agent loops run "
                "against servers; set actor_rollout_ref.rollout.mode=async"
            )
        if self.n < 1:
            raise ValueError(f"rollout.n must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"rollout.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"rollout.top_p must be in (0, 1], got {self.top_p}")
        if self.prompt_length < 1 or self.response_length < 1:
            raise ValueError("rollout.prompt_length and rollout.response_length must be >= 1")
        if self.num_servers is not None and self.num_servers < 1:
            raise ValueError(f"rollout.num_servers must be >= 1 or null, got {self.num_servers}")
        self._check_engine()

    def _check_engine(self) -> None:
        """The engine node, checked here under the keys verl's scripts write (each sets a
        field of ``engine``); ``ServerConfig`` checks it again where a server is built."""
        engine = self.engine
        if engine.max_num_batched_tokens is not None and engine.max_num_batched_tokens < 1:
            raise ValueError(
                f"rollout.max_num_batched_tokens must be >= 1 or null, got "
                f"{engine.max_num_batched_tokens}"
            )
        if engine.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(
                f"rollout.scheduling_policy must be 'priority' or 'fcfs', "
                f"got {engine.scheduling_policy!r}"
            )
        if engine.max_num_seqs is not None and engine.max_num_seqs < 1:
            raise ValueError(
                f"rollout.max_num_seqs must be >= 1 or null, got {engine.max_num_seqs}"
            )
        if engine.weight_transfer not in WEIGHT_TRANSFERS:
            raise ValueError(
                f"actor_rollout_ref.rollout.weight_transfer={engine.weight_transfer!r}: use "
                "host, nccl or ipc"
            )
        if self.lora_sync not in ("adapter", "merged"):
            raise ValueError(
                f"actor_rollout_ref.rollout.lora_sync={self.lora_sync!r}: use adapter (servers "
                "load each LoRA adapter version) or merged (servers get merged full weights)"
            )
        if engine.weight_transfer != "host" and engine.backend != "vllm":
            raise ValueError(
                f"actor_rollout_ref.rollout.weight_transfer={engine.weight_transfer} is vLLM's "
                f"weight-transfer API: set it to host with rollout.name={engine.backend}"
            )

    @property
    def context_length(self) -> int:
        """The servers' context length, derived here once: ``engine.max_model_len``, else
        ``prompt_length + response_length``."""
        return self.engine.max_model_len or self.prompt_length + self.response_length

    @property
    def default_agent_loop(self) -> str:
        """The loop of rows without an ``agent_name``: ``agent.default_agent_loop``, or when
        that is unset, ``tool_agent`` with interactions configured (a simulated user needs a
        multi-turn loop; verl's scripts leave it to ``multi_turn.enable``), else
        ``single_turn_agent``."""
        if self.agent.default_agent_loop is not None:
            return self.agent.default_agent_loop
        interacts = self.multi_turn.interaction_config_path is not None
        return "tool_agent" if interacts else "single_turn_agent"

    def sampling_params(self, *, validate: bool = False) -> dict[str, Any]:
        """Sampling keys of every turn (the loop caps ``max_tokens`` by the budget left);
        ``validate``: those of ``val_kwargs``."""
        params: dict[str, Any] = (
            self.val_kwargs.sampling_params()
            if validate
            else {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}
        )
        if self.multi_turn.max_tokens_per_turn:
            params["max_tokens"] = self.multi_turn.max_tokens_per_turn
        return params


# ---- strict dict -> dataclass ---------------------------------------------------------------
def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check(path: str, hint: Any, value: Any) -> Any:
    """``value`` checked against ``hint`` (``path`` names it in errors), as OmegaConf's typed
    configs do: an int becomes a float for a ``float`` field, and a number becomes its text
    for a ``str`` field (or a union whose only member that takes a number is ``str``);
    a bool is never a number."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        members = [arg for arg in args if arg is not type(None)]
        if _is_number(value) and str in members:
            if not {int, float} & set(members):
                return str(value)  # the union's only home for a number is its text
            members.remove(str)  # a number goes to the numeric member, as it is
        errors = []
        for arg in members:
            try:
                return _check(path, arg, value)
            except (TypeError, ValueError) as exc:
                errors.append(str(exc))
        raise ValueError(errors[0] if errors else f"{path}: bad value {value!r}")
    if origin is Literal:
        allowed = typing.get_args(hint)
        if value not in allowed:
            raise ValueError(
                f"{path} must be one of {', '.join(map(repr, allowed))}, got {value!r}"
            )
        return value
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ValueError(f"{path} must be a mapping of keys, got {type(value).__name__}")
        return from_dict(hint, value, path=path)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{path} must be a list, got {type(value).__name__} {value!r}")
        args = typing.get_args(hint)
        if origin is list and args:
            return [_check(f"{path}[{i}]", args[0], v) for i, v in enumerate(value)]
        return list(value)
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{path} must be a mapping, got {type(value).__name__} {value!r}")
        args = typing.get_args(hint)
        if len(args) == 2:
            return {k: _check(f"{path}.{k}", args[1], v) for k, v in value.items()}
        return dict(value)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is str and _is_number(value):
        return str(value)  # Hydra reads ``name=2024`` as an int; the field wants its text
    if hint in (int, float, str, bool):
        if isinstance(value, bool) and hint is not bool or not isinstance(value, hint):
            raise ValueError(
                f"{path} must be {hint.__name__}, got {type(value).__name__} {value!r}"
            )
    return value


def from_dict(cls: type, data: dict[str, Any] | None, *, path: str = "") -> Any:
    """Build dataclass ``cls`` from ``data``; unknown keys and wrong types raise ``ValueError``
    naming the full key (e.g. ``actor_rollout_ref.rollout.multi_turn.format``)."""
    data = dict(data or {})
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = sorted(set(data) - set(names))
    prefix = f"{path}." if path else ""
    if unknown:
        raise ValueError(
            f"unknown config key {prefix}{unknown[0]}; known keys under {path or 'the root'}: "
            f"{', '.join(names)}"
        )
    kwargs = {k: _check(f"{prefix}{k}", hints[k], v) for k, v in data.items()}
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.init
        and f.name not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ValueError(
            f"missing config key {prefix}{missing[0]}: set it (e.g. {prefix}{missing[0]}=...)"
        )
    return cls(**kwargs)
