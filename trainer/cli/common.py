"""What the console scripts share: reading Hydra ``key=value`` overrides and the one-line
error a command exits with."""

from __future__ import annotations

import logging
import sys

__all__ = ["cli_error", "hydra_argv", "setup_logging"]


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
