"""Shared start-up of the commands that roll out (``agentloop-rollout``, ``agentloop-train``):
the checks that need no server (model, agent loops, tools, tokenizer, dataset), then the
rollout servers and the AgentLoopManager."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentloop.config import RolloutConfig, UserModelConfig
from servers import engine_args, stop_servers
from servers.placement import on_nodes_with
from trainer.config.actor import ModelConfig
from trainer.config.reward import JudgeConfig
from trainer.config.schema import Config
from trainer.config.verl.keys import ENGINE_KEYS
from trainer.launch.worker_logs import init_ray

if TYPE_CHECKING:
    from agentloop import AgentLoopManager

logger = logging.getLogger("agentloop.train")

__all__ = [
    "RolloutSetup",
    "check_engine_kwargs",
    "check_workspace_tasks",
    "warn_toolless_rows",
    "load_split",
    "prepare_rollout",
    "serves_lora",
    "start_judge",
    "start_model_group",
    "start_user_model",
    "start_rollout",
    "wait_for_servers",
    "stop_rollout",
]


@dataclass(slots=True)
class RolloutSetup:
    """What ``prepare_rollout`` checked and loaded; nothing runs yet."""

    model: ModelConfig
    """``actor_rollout_ref.model`` resolved (``resolve_model_config``): its ``path`` and
    ``tokenizer_path`` are local folders, ``custom_chat_template`` is template text. Every
    part started from here loads these."""
    tokenizer: Any
    """The policy's tokenizer (``tokenizer_path``, with ``custom_chat_template``)."""
    tool_names: list[str]
    tool_schemas: list[dict[str, Any]]
    interaction_names: list[str]
    """Configured simulated users (``multi_turn.interaction_config_path``)."""

    @property
    def model_path(self) -> str:
        """The resolved model folder (an asset name or hub id becomes its folder)."""
        return self.model.path


def prepare_rollout(config: Config) -> RolloutSetup:
    """Everything that can be wrong about the model, engine arguments, agent loops and tools;
    raises ValueError. The model (a hub id too) is resolved to local folders here, once."""
    from agentloop import get_agent_loop, load_agent_loop_config
    from agentloop.tools import close_mcp_servers, load_tool_config
    from trainer.models import resolve_model_config, tokenizer_source

    rollout = config.actor_rollout_ref.rollout
    model = resolve_model_config(config.actor_rollout_ref.model, "actor_rollout_ref.model")
    check_engine_kwargs(rollout)
    if rollout.agent.agent_loop_config_path:
        load_agent_loop_config(rollout.agent.agent_loop_config_path, probe=True)
    get_agent_loop(rollout.default_agent_loop)
    path = rollout.multi_turn.tool_config_path
    tools = load_tool_config(path) if path else {}
    # loaded to check them and read their schemas: the agent-loop workers start their own
    close_mcp_servers(tools.values())
    interactions = check_interactions(rollout)
    tokenizer = tokenizer_source(model).load()
    check_chat_format(rollout, tokenizer)
    return RolloutSetup(
        model=model,
        tokenizer=tokenizer,
        tool_names=sorted(tools),
        tool_schemas=[t.tool_schema for t in tools.values()],
        interaction_names=interactions,
    )


def check_interactions(rollout: RolloutConfig) -> list[str]:
    """The configured interactions' names, each loaded once here so a bad class fails before
    any server starts; one that needs a model (``SimulatedUser``) needs
    ``multi_turn.user_model.model_path``. Raises ValueError."""
    from agentloop.interactions import load_interactions

    mt = rollout.multi_turn
    if mt.interaction_config_path is None:
        if mt.user_model.model_path is not None:
            logger.warning(
                "actor_rollout_ref.rollout.multi_turn.user_model.model_path is set but no "
                "interaction_config_path: the user model's servers are not started"
            )
            mt.user_model.model_path = None
        return []
    interactions = load_interactions(mt.interaction_config_path)
    for name, interaction in interactions.items():
        if mt.user_model.model_path is None and getattr(interaction, "needs_user_model", False):
            raise ValueError(
                f"interaction {name!r} ({type(interaction).__name__}) is model-backed: set "
                "actor_rollout_ref.rollout.multi_turn.user_model.model_path"
            )
    return sorted(interactions)


def check_chat_format(rollout: RolloutConfig, tokenizer: Any) -> None:
    """``multi_turn.format`` is a registered format whose end-of-turn tokens the tokenizer
    has; unset, it is derived from the chat template and written into the config so every
    agent-loop worker uses the same. Raises ValueError before any server starts."""
    from agentloop.formats import end_tokens, resolve_format

    key = "actor_rollout_ref.rollout.multi_turn.format"
    try:
        fmt = resolve_format(rollout.multi_turn.format, tokenizer)
        ends = end_tokens(tokenizer, fmt)
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}") from None
    if rollout.multi_turn.format is None:
        logger.info("%s unset: %s, derived from the chat template", key, fmt.name)
        rollout.multi_turn.format = fmt.name
    logger.info("model turns end with %s (%s)", " or ".join(ends.strings), fmt.name)


def load_split(config: Config, setup: RolloutSetup, split: str) -> list[dict[str, Any]]:
    """Rows of ``data.train_files`` or ``data.val_files``, length-filtered and checked."""
    from agentloop import validate_rows
    from trainer.data.rows import load_rows

    files = config.data.files(config.data.val_files if split == "val" else config.data.train_files)
    if not files:  # the environment's own dataset, when one is configured
        from trainer.data.env_rows import environment_rows

        files = environment_rows(config.data.env_dataset, split, config.trainer.default_local_dir)
    if not files:
        raise ValueError(
            f"set data.{'val' if split == 'val' else 'train'}_files (or data.env_dataset: an "
            "environment that brings its dataset)"
        )
    rollout = config.actor_rollout_ref.rollout
    rows = load_rows(
        files,
        config.data,
        setup.tokenizer,
        tools=setup.tool_schemas,
        chat_template_kwargs=rollout.chat_template_kwargs,
    )
    default = rollout.default_agent_loop
    validate_rows(rows, setup.tool_names, default, setup.interaction_names)
    check_workspace_tasks(rows, files, split)
    warn_toolless_rows(rows, setup.tool_names, rollout.default_agent_loop, split)
    return rows


def check_workspace_tasks(rows: list[dict[str, Any]], files: list[str], split: str) -> None:
    """Rows with a workspace task (``agentloop.workspace``) are checked here, their relative
    ``workspace`` paths taken from the (first) data file's folder and made absolute in the rows;
    a bad row raises ValueError naming the files, the row and the key."""
    from pathlib import Path

    from agentloop.workspace.task import WorkspaceTaskError, resolve_task_rows

    base = Path(files[0]).expanduser().resolve().parent
    try:
        count = resolve_task_rows(rows, base)
    except WorkspaceTaskError as exc:
        raise ValueError(f"data.{split}_files ({', '.join(files)}): {exc}") from None
    if count:
        logger.info("data.%s_files: %d rows are workspace tasks", split, count)


def warn_toolless_rows(
    rows: list[dict[str, Any]], tool_names: list[str], default_agent_loop: str, split: str
) -> None:
    """With tools configured, say (once per split) how many rows run a loop that offers the
    model none, and what to set."""
    from agentloop import toolless_rows

    if not tool_names:
        return
    counts = toolless_rows(rows, default_agent_loop)
    if not counts:
        return
    loops = ", ".join(f"{n} run {name}" for name, n in sorted(counts.items()))
    logger.warning(
        "data.%s_files: %d of %d rows never see the configured tools (%s) because their agent "
        "loop offers none (%s): give the rows agent_name: tool_agent, or set "
        "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent for rows without one",
        split,
        sum(counts.values()),
        len(rows),
        ", ".join(tool_names),
        loops,
    )


# The key that sets each ServerConfig field start_rollout fills, as verl's scripts write it
# (servers/engine_args.py names these when an engine_kwargs entry would override one): the
# model's, and each engine field's verl spelling (``trainer.config.verl.keys.ENGINE_KEYS``).
_ROLLOUT = "actor_rollout_ref.rollout"
_SERVER_FIELD_KEYS = {
    "model": "actor_rollout_ref.model.path",
    "tokenizer": "actor_rollout_ref.model.tokenizer_path",
    "trust_remote_code": "actor_rollout_ref.model.trust_remote_code",
    **{name: f"{_ROLLOUT}.{verl}" for verl, name in ENGINE_KEYS.items()},
    "lora_rank": "actor_rollout_ref.model.lora_rank",
    "lora_adapter_path": "actor_rollout_ref.model.lora_adapter_path",
}


def check_engine_kwargs(rollout: RolloutConfig) -> None:
    """``rollout.engine.engine_kwargs`` (verl's ``engine_kwargs.<name>``) holds only arguments
    that the engine takes and that no rollout key sets; the error names the key to use. Imports
    the engine (vLLM: some seconds) only when the table is not empty."""
    backend = rollout.engine.backend
    key = f"{_ROLLOUT}.engine_kwargs.{backend}"
    engine_args.check_engine_kwargs(
        backend, rollout.engine.engine_kwargs, key=key, owners=_SERVER_FIELD_KEYS
    )


def serves_lora(rollout: RolloutConfig, lora: bool = True) -> bool:
    """Whether rollout servers load LoRA adapters: vLLM ones, unless ``lora`` is off (training
    with ``actor_rollout_ref.rollout.lora_sync=merged``)."""
    return lora and rollout.engine.backend == "vllm"


def start_rollout(
    rollout: RolloutConfig,
    model: ModelConfig,
    gpu_share: float | None = None,
    *,
    num_servers: int,
    lora: bool = True,
    user_servers: list[Any] | None = None,
    user_tokenizer: str | None = None,
    wait: bool = True,
) -> tuple[list[Any], AgentLoopManager]:
    """Ray (local unless already connected), the AsyncServers and the AgentLoopManager (which
    restarts a server that dies; the handles list is updated in place), from
    ``actor_rollout_ref.rollout`` and the resolved ``model`` (``RolloutSetup.model``).

    ``gpu_share``: GPUs per tensor-parallel rank a server asks Ray for (None: whole GPUs;
    a fraction lets colocated trainer ranks share them). ``num_servers``: how many
    (``Config.servers_for``). ``lora``: vLLM servers run with LoRA at ``model.lora_rank`` (and
    serve ``model.lora_adapter_path``); False: without (a LoRA actor then sends merged weights).
    ``wait=False``: return while the engines load; ``wait_for_servers`` before the first use."""

    from agentloop import AgentLoopManager
    from servers import ServerConfig, ServerGroup
    from trainer.models import tokenizer_source

    server_config = ServerConfig.of_engine(
        rollout.engine,
        max_model_len=rollout.context_length,
        model=model.path,
        tokenizer=model.tokenizer_path,
        trust_remote_code=model.trust_remote_code,
        chat_template=model.custom_chat_template,
        external_lib=model.external_lib,
        # SGLang loads no adapters here: it serves merged weights (``WeightSync.starts_ahead``)
        lora_rank=model.lora_rank if serves_lora(rollout, lora) else 0,
        lora_adapter_path=model.lora_adapter_path if serves_lora(rollout, lora) else None,
    )
    init_ray()  # no-op where agentloop-train started it at trainer.worker_log_level
    num_gpus = None if gpu_share is None else gpu_share * rollout.engine.tensor_parallel_size
    group = ServerGroup(
        server_config,
        num_servers,
        num_gpus=num_gpus,
        max_restarts=rollout.recovery.max_server_restarts,
        node_resource=rollout.node_resource,
        wait=wait,
    )
    manager = AgentLoopManager(
        rollout,
        group,
        tokenizer_source(model),
        user_servers=user_servers or None,
        user_tokenizer=user_tokenizer,
        worker_options=on_nodes_with(rollout.agent.node_resource),
    )
    return group.handles, manager


def wait_for_servers(manager: AgentLoopManager) -> None:
    """Block until the servers ``start_rollout(..., wait=False)`` started are ready."""
    if manager.group is not None:
        manager.group.wait_ready()


def start_judge(judge: JudgeConfig, device: str) -> tuple[list[Any], Any, Any]:
    """The judge's own AsyncServer group (``reward_model.judge``): its servers, the load
    balancer over them and the judge tokenizer."""
    from transformers import AutoTokenizer

    from servers import AsyncLLMServerManager

    path, servers = start_model_group(judge, "reward_model.judge", device)
    return servers, AsyncLLMServerManager(servers), AutoTokenizer.from_pretrained(path)


def start_user_model(user: UserModelConfig, device: str) -> tuple[list[Any], str | None]:
    """The simulated users' own AsyncServer group (``multi_turn.user_model``) and its model
    folder (the workers' tokenizer); ``([], None)`` without ``model_path``."""
    if user.model_path is None:
        return [], None
    path, servers = start_model_group(
        user, "actor_rollout_ref.rollout.multi_turn.user_model", device
    )
    return servers, path


def start_model_group(group: JudgeConfig | UserModelConfig, key: str, device: str):
    """A model's own server group beside the rollout servers (the judge's, the simulated
    users'), without HTTP: on GPU each server takes ``tensor_model_parallel_size`` GPUs of its
    own; on CPU it shares the node (no CPU claimed in Ray's accounting, like the trainer
    ranks). Returns the resolved model folder and the server handles."""
    from servers import ServerConfig, launch_servers
    from trainer.models import resolve_model

    path = resolve_model(group.model_path, f"{key}.model_path")
    server_config = ServerConfig(
        model=path,
        tensor_parallel_size=group.tensor_model_parallel_size,
        gpu_memory_utilization=group.gpu_memory_utilization,
        max_model_len=group.max_model_len,
        http=False,
    )
    init_ray()
    gpus = float(group.tensor_model_parallel_size) if device == "cuda" else 0.0
    servers = launch_servers(
        server_config,
        group.num_servers,
        num_cpus=0 if device == "cpu" else 1,
        num_gpus=gpus,
        node_resource=group.node_resource,
    )
    return path, servers


def stop_rollout(servers: list[Any], manager: AgentLoopManager) -> None:
    """Stop the agent-loop workers (flushing their traces), then the servers."""
    try:
        manager.shutdown()
    finally:
        stop_servers(servers)
