"""Repository tasks: a workspace per sample, sandboxed, scored by the task's check.

``tasks_of_rows`` validates the rows (``task.py``), ``WorkspacePool`` gives each sample a fresh
copy in the bubblewrap sandbox from a warm pool (``pool.py``), and ``Workspace.check`` runs the
task's check, whose ``CheckResult`` is the sample's reward (``check.py``). The workspace tools
(``bash``, ``read_file``, ``write_file``, ``str_replace``, ``run_check``; ``tools.py``) act on
``current_workspace()``; the agent-loop worker runs a row with a task inside its workspace
(``loop_hook.py``). See docs/repo-tasks.md.
"""

from agentloop.workspace.check import CheckResult, pytest_counts, score_check
from agentloop.workspace.config import WorkspaceConfig
from agentloop.workspace.loop_hook import (
    WorkspaceAgentError,
    run_loop_in_workspace,
    workspace_metrics,
)
from agentloop.workspace.metrics import WorkspaceMetrics
from agentloop.workspace.pool import SandboxError, Workspace, WorkspacePool, current_workspace
from agentloop.workspace.runner import CommandResult, resolve_backend, run_command
from agentloop.workspace.sample import SampleOutcome, run_workspace_sample
from agentloop.workspace.task import (
    WorkspaceTask,
    WorkspaceTaskError,
    has_workspace_task,
    resolve_task_rows,
    task_of_row,
    tasks_of_rows,
)
from agentloop.workspace.tools import (
    TOOL_NAMES,
    WorkspaceTool,
    bash,
    read_file,
    run_check,
    str_replace,
    workspace_tools,
    write_file,
)

__all__ = [
    "TOOL_NAMES",
    "CheckResult",
    "CommandResult",
    "SampleOutcome",
    "SandboxError",
    "Workspace",
    "WorkspaceConfig",
    "WorkspaceMetrics",
    "WorkspacePool",
    "WorkspaceTask",
    "WorkspaceAgentError",
    "WorkspaceTaskError",
    "WorkspaceTool",
    "bash",
    "current_workspace",
    "has_workspace_task",
    "pytest_counts",
    "read_file",
    "resolve_task_rows",
    "resolve_backend",
    "run_check",
    "run_command",
    "run_loop_in_workspace",
    "run_workspace_sample",
    "score_check",
    "str_replace",
    "task_of_row",
    "tasks_of_rows",
    "workspace_metrics",
    "workspace_tools",
    "write_file",
]
