"""The workspace reward from a check's result: all-or-nothing, partial credit by named tests or
by pytest's summary line, and 0 with the reason for a check stopped at a limit."""

from __future__ import annotations

from pathlib import Path

from agentloop.workspace import CommandResult, WorkspaceTask, pytest_counts, score_check

PYTEST_OUT = b"""\
tests/test_a.py::test_one PASSED                                       [ 33%]
tests/test_a.py::test_two FAILED                                       [ 66%]
tests/test_b.py::test_three PASSED                                     [100%]
=========================== short test summary info ============================
FAILED tests/test_a.py::test_two - assert 1 == 2
========================= 1 failed, 2 passed in 0.05s ==========================
"""


def task(**kw) -> WorkspaceTask:
    return WorkspaceTask(workspace=Path("/w"), problem="p", check=("true",), **kw)


def test_pytest_counts_reads_the_last_summary_line():
    assert pytest_counts(PYTEST_OUT.decode()) == {"failed": 1, "passed": 2}
    assert pytest_counts("..\n2 passed, 1 error, 1 skipped in 1.20s\n") == {
        "passed": 2,
        "errors": 1,
        "skipped": 1,
    }
    assert pytest_counts("no summary here") == {}


def test_all_or_nothing_follows_the_exit_code():
    failed = score_check(task(), CommandResult(1, PYTEST_OUT, 0.5), 100)
    assert (failed.score, failed.passed, failed.failed, failed.reason) == (0.0, 2, 1, None)
    ok = score_check(task(), CommandResult(0, b"3 passed in 0.1s\n", 0.5), 100)
    assert ok.score == 1.0 and ok.exit_code == 0


def test_partial_credit_counts_the_named_tests_only():
    named = ("tests/test_a.py::test_one", "tests/test_a.py::test_two")
    out = score_check(task(partial=True, tests=named), CommandResult(1, PYTEST_OUT, 0.5), 100)
    assert (out.score, out.passed, out.failed) == (0.5, 1, 1)
    ra = b"PASSED tests/test_a.py::test_one\nFAILED tests/test_a.py::test_two - x\n"
    out = score_check(task(partial=True, tests=named), CommandResult(1, ra, 0.5), 100)
    assert out.score == 0.5


def test_partial_credit_from_the_summary_line_and_its_absence():
    out = score_check(task(partial=True), CommandResult(1, PYTEST_OUT, 0.5), 100)
    assert out.score == 2 / 3
    none = score_check(task(partial=True), CommandResult(2, b"ImportError", 0.5), 100)
    assert none.score == 0.0
    assert none.reason == "partial credit: no pytest summary line in the check's output"


def test_a_check_stopped_at_a_limit_scores_zero_with_the_reason():
    hung = score_check(task(), CommandResult(None, b"", 5.04, timed_out=True), 100)
    assert hung.as_reward() == {
        "score": 0.0,
        "passed": 0,
        "failed": 0,
        "timed_out": True,
        "reason": "check timed out after 5.0 s and was killed",
        "check_s": 5.04,
        "exit_code": None,
        "output_tail": "",
    }
    loud = score_check(task(), CommandResult(-9, b"y\n" * 50, 1.0, overflow=True), 10)
    assert loud.reason == "check printed more than 100 bytes and was stopped"
    assert loud.output_tail == "y\n" * 5 and loud.score == 0.0
