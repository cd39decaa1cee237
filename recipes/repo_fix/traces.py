"""The task's prompt text and its solved conversation for the SFT warm start.

A solved conversation is what a good agent does with the workspace tools
(``agentloop.workspace.tools``): read the bugged module, ``str_replace`` the bug by the
correct text, ``run_check``, then a one-line answer. Tool answers are written as those tools
write them: ``read_file`` numbers lines like ``cat -n``, ``str_replace`` says
``replaced 1 occurrence in <path>``, ``run_check`` gives its verdict line and the tail of
pytest's ``-q -rA`` output. ``TOOL_SCHEMAS`` are the five tools' schemas as the tool config
offers them, so an SFT prompt renders exactly like an RL prompt.

A recovering conversation (``recovering_conversation``) first reads the package's other
module, the mistake small models make most (a third of the 12-step SFT model's held-out
samples, every one of them failed), then says the function is not there and reads the module
the problem lists it in. The mistaken turn has ``weight`` 0 (``agentloop-sft`` keeps it in the
trajectory, untrained), so the model learns the recovery, not the mistake.
"""

from __future__ import annotations

from typing import Any

from recipes.repo_fix.package import Package, SeededBug

__all__ = [
    "CHECK",
    "SYSTEM",
    "TOOL_SCHEMAS",
    "check_answer",
    "numbered",
    "problem_of",
    "recovering_conversation",
    "solved_conversation",
]

CHECK = "python -m pytest -q -rA -p no:cacheprovider tests/"
SYSTEM = (
    "You fix bugs in a small Python repository. Read the code with read_file, edit it with "
    "str_replace, run the tests with run_check. Make the smallest fix; do not change the tests."
)
_KIND_TEXT = {
    "off_by_one": "an off-by-one error",
    "wrong_operator": "the wrong operator",
    "wrong_comparison": "the wrong comparison",
    "missing_case": "a missing case",
    "swapped_arguments": "swapped arguments",
}
_MAX_LISTED = 3


def _fn(name: str, description: str, params: dict[str, tuple[str, str]], required: list[str]):
    properties = {p: {"type": t, "description": d} for p, (t, d) in params.items()}
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


_PATH = ("string", "The file, relative to the workspace folder.")
TOOL_SCHEMAS = [
    _fn(
        "bash",
        "Run a shell command in the workspace (sh -c) and return its exit code and output.",
        {
            "command": (
                "string",
                "The shell command, run with the workspace folder as the working directory.",
            )
        },
        ["command"],
    ),
    _fn(
        "read_file",
        "Read a text file of the workspace; lines come numbered.",
        {
            "path": _PATH,
            "start_line": ("integer", "The first line to show (1-based; default the first)."),
            "end_line": ("integer", "The last line to show (inclusive; default the last)."),
        },
        ["path"],
    ),
    _fn(
        "write_file",
        "Create or overwrite a file of the workspace (its folders are created).",
        {"path": _PATH, "content": ("string", "The whole new content of the file.")},
        ["path", "content"],
    ),
    _fn(
        "str_replace",
        "Replace text in a file of the workspace; the old text must occur exactly once.",
        {
            "path": _PATH,
            "old": ("string", "The exact text to replace (whitespace included)."),
            "new": ("string", "The text to put in its place."),
        },
        ["path", "old", "new"],
    ),
    _fn(
        "run_check",
        "Run the task's check (its tests) on the workspace now and return whether it passes.",
        {},
        [],
    ),
]
"""The workspace tools' schemas (``schema_from_function`` of each, in ``TOOL_NAMES`` order)."""


def problem_of(package: Package, bug: SeededBug) -> str:
    """The failing behaviour (test names, calls, expected and observed), never the fix."""
    lines = [f"Running `{CHECK}` in this repository fails:"]
    for case, observed in bug.failing[:_MAX_LISTED]:
        lines.append(
            f"- `{package.node_id(case)}` expects {case.expectation()}, but it {observed}."
        )
    if len(bug.failing) > _MAX_LISTED:
        lines.append(f"- and {len(bug.failing) - _MAX_LISTED} more failing tests.")
    lines.append("")
    lines.append(f"Files of the `{package.name}` package:")
    for module, functions in package.modules.items():
        names = ", ".join(n for f in functions for n in f.defined)
        lines.append(f"- {package.module_path(module)}: {names}")
    lines.append(f"- {package.test_path}: the tests")
    lines.append("")
    lines.append("Fix the bug in the package so that every test passes.")
    return "\n".join(lines)


def numbered(text: str) -> str:
    """A file as ``read_file`` answers: each line after its number (``cat -n``)."""
    return "\n".join(f"{n:6d}\t{line}" for n, line in enumerate(text.splitlines(), 1))


def check_answer(node_ids: list[str]) -> str:
    """``run_check``'s answer for a passing pytest ``-q -rA`` run of ``node_ids``."""
    width = 80
    lines = [
        f"check passed: score 1 ({len(node_ids)} passed, 0 failed)",
        "." * len(node_ids) + " " * (width - 6 - len(node_ids)) + "[100%]",
        " PASSES ".center(width, "="),
        " short test summary info ".center(width, "="),
        *(f"PASSED {n}" for n in node_ids),
        f"{len(node_ids)} passed in 0.02s",
    ]
    return "\n".join(lines)


def _call(name: str, arguments: dict[str, Any], content: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}],
    }


def _called(bug: SeededBug) -> str:
    """The function the first failing test calls."""
    return bug.failing[0][0].call.split("(", 1)[0]


def solved_conversation(package: Package, bug: SeededBug) -> list[dict[str, Any]]:
    """system, user problem, read_file, str_replace (the fix), run_check, final answer."""
    path = package.module_path(bug.module)
    bugged = package.files(bug)[path]
    called = _called(bug)
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": problem_of(package, bug)},
        _call("read_file", {"path": path}, f"`{called}` is in {path}. Reading it."),
        {"role": "tool", "content": numbered(bugged)},
        *_fixed(package, bug),
    ]


def recovering_conversation(package: Package, bug: SeededBug) -> list[dict[str, Any]]:
    """``solved_conversation`` after a first read of the package's other module (weight 0:
    kept, not trained) and a turn that notices the function is not there."""
    path = package.module_path(bug.module)
    other = next(package.module_path(m) for m in package.modules if m != bug.module)
    files = package.files(bug)
    called = _called(bug)
    mistake = _call("read_file", {"path": other}, f"`{called}` is in {other}. Reading it.")
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": problem_of(package, bug)},
        {**mistake, "weight": 0},
        {"role": "tool", "content": numbered(files[other])},
        _call(
            "read_file",
            {"path": path},
            f"`{called}` is not in {other}; the problem lists it in {path}. Reading that.",
        ),
        {"role": "tool", "content": numbered(files[path])},
        *_fixed(package, bug),
    ]


def _fixed(package: Package, bug: SeededBug) -> list[dict[str, Any]]:
    """The turns after the bugged module was read: the fix, the check, the answer."""
    path = package.module_path(bug.module)
    kind = _KIND_TEXT[bug.kind]
    node_ids = [package.node_id(c) for c in package.cases]
    return [
        _call(
            "str_replace",
            {"path": path, "old": bug.new, "new": bug.old},
            f"`{bug.function}` has {kind}. Fixing it.",
        ),
        {"role": "tool", "content": f"replaced 1 occurrence in {path}"},
        _call("run_check", {}, "Running the tests."),
        {"role": "tool", "content": check_answer(node_ids)},
        {"role": "assistant", "content": f"Fixed {kind} in `{bug.function}` ({path})."},
    ]
