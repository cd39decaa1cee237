"""The start-up the Hydra-config commands share (``trainer.cli.common``): help prints the
docstring, a ``ValueError`` while checking is one line on stderr with exit code 2, and an
extra ``+key`` a command does not take is refused naming the ones it does."""

from __future__ import annotations

import pytest

from trainer.cli.common import load_command_config, run_command
from trainer.config import ConfigError

MODEL = "actor_rollout_ref.model.path=m"  # the one key without a default


def never(_started: object) -> int:
    raise AssertionError("run after a failed start")


def test_help_prints_the_docstring_and_runs_nothing(capsys):
    assert run_command("prog", "the doc\n", ["-h"], never, never) == 0
    assert capsys.readouterr().out == "the doc\n"


def test_a_value_error_at_start_is_one_line_and_exit_2(capsys):
    def start(overrides: list[str]) -> None:
        raise ValueError(f"set a.b (got {overrides})")

    assert run_command("prog", None, ["a.b=1"], start, never) == 2
    assert capsys.readouterr().err == "prog: error: set a.b (got ['a.b=1'])\n"


def test_run_gets_what_start_returned():
    assert run_command("prog", None, ["x=1"], lambda o: len(o) + 6, lambda n: n) == 7


@pytest.mark.parametrize(
    ("takes", "message"),
    [
        ((), "unknown extra +epochs: agentloop-train takes none"),
        (
            ("output", "split"),
            "unknown extra +epochs; agentloop-train takes +output, +split",
        ),
    ],
)
def test_an_extra_the_command_does_not_take_is_refused(takes, message):
    with pytest.raises(ConfigError) as exc_info:
        load_command_config("agentloop-train", [MODEL, "+epochs=3", "+output=o"], takes)
    assert str(exc_info.value) == message


def test_extras_the_command_takes_come_back():
    _, extras = load_command_config("agentloop-rollout", [MODEL, "+output=o.jsonl"], ("output",))
    assert extras == {"output": "o.jsonl"}
