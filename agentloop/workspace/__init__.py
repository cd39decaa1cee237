"""Repository tasks: a workspace per sample, sandboxed, scored by the task's check.

``tasks_of_rows`` validates the rows (``task.py``), ``WorkspacePool`` gives each sample a fresh
copy in the bubblewrap sandbox from a warm pool (``pool.py``), and ``Workspace.check`` runs the
task's check, whose ``CheckResult`` is the sample's reward (``check.py``). See
docs/repo-tasks.md.
"""

from agentloop.workspace.check import CheckResult, pytest_counts, score_check
from agentloop.workspace.config import WorkspaceConfig
from agentloop.workspace.metrics import WorkspaceMetrics
from agentloop.workspace.pool import SandboxError, Workspace, WorkspacePool, current_workspace
from agentloop.workspace.runner import CommandResult, resolve_backend, run_command
from agentloop.workspace.sample import SampleOutcome, run_workspace_sample
from agentloop.workspace.task import (
    WorkspaceTask,
    WorkspaceTaskError,
    task_of_row,
    tasks_of_rows,
)

__all__ = [
    "CheckResult",
    "CommandResult",
    "SampleOutcome",
    "SandboxError",
    "Workspace",
    "WorkspaceConfig",
    "WorkspaceMetrics",
    "WorkspacePool",
    "WorkspaceTask",
    "WorkspaceTaskError",
    "current_workspace",
    "pytest_counts",
    "resolve_backend",
    "run_command",
    "run_workspace_sample",
    "score_check",
    "task_of_row",
    "tasks_of_rows",
]
