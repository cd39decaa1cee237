"""What the console scripts share: reading Hydra ``key=value`` overrides, the start-up checks
that end in one line saying what to change, and the logging they set up.

``agentloop-train``, ``agentloop-rollout`` and ``agentloop-sft`` each start the same way
(``run_command``): ``-h`` prints the module docstring; otherwise the command's ``start`` runs
every check on the overrides before anything starts, a ``ValueError`` there is the one-line
error (exit 2), and ``run`` gets what ``start`` returned.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from trainer.config import load_command_config

if TYPE_CHECKING:
    pass

__all__ = ["cli_error", "hydra_argv", "load_command_config", "run_command", "setup_logging"]

Started = TypeVar("Started")


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")


def hydra_argv(argv: list[str] | None, doc: str | None) -> list[str] | None:
    """The ``key=value`` overrides of a Hydra-config command (logging set up), or None when
    ``-h``/``--help`` printed the command's docstring."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("-h", "--help") for a in argv):
        sys.stdout.write(doc or "")
        return None
    setup_logging()
    return argv


def cli_error(prog: str, message: str) -> int:
    """One line on stderr saying what to change; exit code 2."""
    sys.stderr.write(f"{prog}: error: {message}\n")
    return 2


def run_command(
    prog: str,
    doc: str | None,
    argv: list[str] | None,
    start: Callable[[list[str]], Started],
    run: Callable[[Started], int],
) -> int:
    """Command ``prog``'s exit code: 0 after ``-h`` printed ``doc``; 2 with one line on stderr
    when ``start(overrides)`` (every start-up check, nothing running yet) raises a
    ``ValueError``; else ``run`` of what ``start`` returned."""
    overrides = hydra_argv(argv, doc)
    if overrides is None:
        return 0
    try:
        started = start(overrides)
    except ValueError as exc:
        return cli_error(prog, str(exc))
    return run(started)
