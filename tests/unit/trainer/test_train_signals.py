"""agentloop-train's signal handling, with real signals to this process: the first SIGTERM or
SIGINT asks the trainer to stop after its step; a second stops at once."""

from __future__ import annotations

import os
import signal

import pytest

from trainer.cli.train import stop_on_signals


class Trainer:
    def __init__(self) -> None:
        self.requests = 0

    def request_stop(self) -> None:
        self.requests += 1


@pytest.fixture(autouse=True)
def restore_handlers():
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


@pytest.mark.parametrize("first", [signal.SIGTERM, signal.SIGINT])
def test_the_first_signal_asks_for_a_stop_after_the_step_and_a_second_stops_at_once(first, capsys):
    trainer = Trainer()
    stop_on_signals(trainer)
    os.kill(os.getpid(), first)
    assert trainer.requests == 1
    assert capsys.readouterr().err == (
        f"agentloop-train: {first.name}: stopping after the step in progress, with a "
        "checkpoint (send it again to stop at once)\n"
    )
    with pytest.raises(SystemExit) as stopped:
        os.kill(os.getpid(), signal.SIGTERM)
    assert stopped.value.code == 143
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
    assert trainer.requests == 1
