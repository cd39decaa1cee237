"""A small generated Python package: modules drawn from templates, its pytest file, its bugs.

``draw_package`` draws a package from a theme (two modules of two or three functions, names
and constants varied). The tests' expected values are what the correct code returns (or the
exception it raises). ``Package.bugs()`` seeds each template bug in turn, runs every test
case against the bugged code in-process (the same ``==`` / exception-type comparison the
generated pytest file makes) and keeps the bugs that make at least one test fail, with the
failing tests and what they got. ``tests/unit/recipes/test_repo_fix.py`` runs the real pytest
on generated workspaces to hold the two in agreement.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from string import Template
from typing import Any

from recipes.repo_fix.templates import TEMPLATES, THEMES, FunctionTemplate

__all__ = ["Case", "Function", "Package", "SeededBug", "draw_package"]

_SUFFIXES = ("", "_utils", "lib", "_tools", "x", "_core")


@dataclass(frozen=True, slots=True)
class Function:
    """A template drawn into a module: its names, constants and source text."""

    template: FunctionTemplate
    mapping: dict[str, str]
    module: str

    @property
    def name(self) -> str:
        return self.mapping["fn"]

    @property
    def defined(self) -> list[str]:
        """Every function name the source defines (helper first)."""
        return [self.mapping[k] for k in self.template.names if k != "fn"] + [self.name]

    def fill(self, text: str) -> str:
        return Template(text).substitute(self.mapping)


@dataclass(frozen=True, slots=True)
class Case:
    """One generated test: ``assert call == expected`` or ``pytest.raises(raises)``."""

    name: str
    call: str
    function: str
    expected: Any = None
    raises: str | None = None

    def body(self) -> str:
        if self.raises:
            return f"    with pytest.raises({self.raises}):\n        {self.call}\n"
        return f"    assert {self.call} == {self.expected!r}\n"

    def expectation(self) -> str:
        if self.raises:
            return f"`{self.call}` to raise {self.raises}"
        return f"`{self.call}` to return `{self.expected!r}`"


@dataclass(frozen=True, slots=True)
class SeededBug:
    """A bug in one module: ``old`` (correct) replaced by ``new``; the failing tests and what
    each observed (``returned X`` / ``raised E: message``)."""

    kind: str
    template: str
    """The key of the template the bug came from."""
    module: str
    function: str
    old: str
    new: str
    failing: tuple[tuple[Case, str], ...]


def _outcome(call: str, ns: dict[str, Any]) -> tuple[Any, BaseException | None]:
    try:
        return eval(call, dict(ns)), None  # noqa: S307 (the package's own template code)
    except Exception as exc:  # a bugged function may raise anything
        return None, exc


def _enclosing(source: str, snippet: str) -> str:
    """The name of the function whose body holds ``snippet``."""
    head = source[: source.index(snippet)]
    return head[head.rindex("\ndef ") + 5 :].split("(", 1)[0]


def _namespace(sources: dict[str, str]) -> dict[str, Any]:
    ns: dict[str, Any] = {}
    for source in sources.values():
        exec(compile(source, "<package>", "exec"), ns)  # noqa: S102 (template code)
    return ns


@dataclass(frozen=True, slots=True)
class Package:
    """A generated package: ``name``, modules in order, and its test cases."""

    name: str
    modules: dict[str, list[Function]]
    cases: tuple[Case, ...]

    @property
    def test_path(self) -> str:
        return f"tests/test_{self.name}.py"

    def node_id(self, case: Case) -> str:
        return f"{self.test_path}::{case.name}"

    def module_path(self, module: str) -> str:
        return f"{self.name}/{module}.py"

    def module_source(self, module: str) -> str:
        head = f'"""{module.capitalize()} helpers of the {self.name} package."""\n\n\n'
        return head + "\n\n".join(f.fill(f.template.source) for f in self.modules[module])

    def sources(self) -> dict[str, str]:
        return {m: self.module_source(m) for m in self.modules}

    def test_source(self) -> str:
        lines = [f'"""Tests of the {self.name} package."""\n\n']
        if any(c.raises for c in self.cases):
            lines.append("import pytest\n\n")
        for module, functions in self.modules.items():
            names = ", ".join(sorted(n for f in functions for n in f.defined))
            lines.append(f"from {self.name}.{module} import {names}\n")
        for case in self.cases:
            lines.append(f"\n\ndef {case.name}():\n{case.body()}")
        return "".join(lines)

    def files(self, bug: SeededBug | None = None) -> dict[str, str]:
        """Relative path -> text of the workspace, with ``bug`` seeded when given."""
        files = {f"{self.name}/__init__.py": f'"""The {self.name} package."""\n'}
        for module, source in self.sources().items():
            if bug is not None and bug.module == module:
                source = source.replace(bug.old, bug.new, 1)
            files[self.module_path(module)] = source
        files[self.test_path] = self.test_source()
        return files

    def failures(self, sources: dict[str, str]) -> list[tuple[Case, str]]:
        """The cases that fail against ``sources`` and what each observed."""
        ns = _namespace(sources)
        failed = []
        for case in self.cases:
            value, exc = _outcome(case.call, ns)
            if case.raises:
                if exc is None:
                    failed.append((case, f"returned `{value!r}`"))
                elif type(exc).__name__ != case.raises:
                    failed.append((case, f"raised {type(exc).__name__}: {exc}"))
            elif exc is not None:
                failed.append((case, f"raised {type(exc).__name__}: {exc}"))
            elif not value == case.expected:
                failed.append((case, f"returned `{value!r}`"))
        return failed

    def bugs(self) -> list[SeededBug]:
        """Every template bug that fails at least one test, in template order."""
        sources = self.sources()
        found = []
        for module, functions in self.modules.items():
            for function in functions:
                for bug in function.template.bugs:
                    old, new = function.fill(bug.old), function.fill(bug.new)
                    source = sources[module]
                    assert source.count(old) == 1, (function.template.key, old)
                    bugged = source.replace(old, new, 1)
                    if bugged.count(new) != 1:  # the fix could not find its anchor
                        continue
                    failing = self.failures({**sources, module: bugged})
                    if failing:
                        where = _enclosing(source, old)
                        found.append(
                            SeededBug(
                                bug.kind,
                                function.template.key,
                                module,
                                where,
                                old,
                                new,
                                tuple(failing),
                            )
                        )
        return found


def _draw_function(
    rng: random.Random, template: FunctionTemplate, module: str, taken: set[str]
) -> Function:
    mapping: dict[str, str] = {}
    for key, choices in template.names.items():
        free = [c for c in choices if c not in taken]
        mapping[key] = rng.choice(free)
        taken.add(mapping[key])
    for key, choices in template.constants.items():
        mapping[key] = rng.choice(choices)
    return Function(template, mapping, module)


def _cases(modules: dict[str, list[Function]]) -> tuple[Case, ...]:
    """Each template test, its expectation taken from the correct code."""
    sources = {
        m: "\n\n".join(f.fill(f.template.source) for f in functions)
        for m, functions in modules.items()
    }
    ns = _namespace(sources)
    cases = []
    for functions in modules.values():
        for function in functions:
            for case, call in function.template.tests:
                call = function.fill(call)
                name = f"test_{function.name}_{case}"
                value, exc = _outcome(call, ns)
                if exc is not None:
                    cases.append(Case(name, call, function.name, raises=type(exc).__name__))
                else:
                    assert eval(repr(value)) == value, (name, value)  # noqa: S307
                    cases.append(Case(name, call, function.name, expected=value))
    return tuple(cases)


def draw_package(rng: random.Random, taken_names: set[str]) -> Package:
    """A new package whose name is not in ``taken_names`` (the name is added to it)."""
    theme = rng.choice(THEMES)
    free = [s + x for s in theme.stems for x in _SUFFIXES if s + x not in taken_names]
    name = rng.choice(free) if free else f"{rng.choice(theme.stems)}{len(taken_names)}"
    while name in taken_names:
        name += "_"
    taken_names.add(name)
    modules = rng.sample(theme.modules, 2)
    keys = rng.sample(theme.templates, rng.choice((4, 5)))
    split = 2 if len(keys) == 4 else rng.choice((2, 3))
    taken: set[str] = set()
    drawn = {
        modules[0]: [_draw_function(rng, TEMPLATES[k], modules[0], taken) for k in keys[:split]],
        modules[1]: [_draw_function(rng, TEMPLATES[k], modules[1], taken) for k in keys[split:]],
    }
    return Package(name, drawn, _cases(drawn))
