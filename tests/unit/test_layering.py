"""The layer rules of docs/architecture.md, read off the source with ``ast`` (imports inside
functions count: a loop hidden in a function is still a loop):

- no import loops between the project's modules;
- ``servers`` imports neither ``agentloop`` nor ``trainer``; ``agentloop`` never imports
  ``trainer``; nothing in the core packages imports ``recipes``;
- nothing outside ``trainer/cli/`` imports a console-script module;
- ``servers/`` names no trainer config key;
- no module imports another module's private (``_``-prefixed) name: what two modules share is
  public, with a docstring, in one of them.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("servers", "agentloop", "trainer")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _import_base(name: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` in module ``name`` reads from."""
    base = node.module or ""
    if node.level:
        anchor = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        anchor = anchor[: len(anchor) - node.level + 1]
        base = ".".join([*anchor, base] if base else anchor)
    return base


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Project modules ``name`` imports anywhere in its body (``from a import b`` counts
    ``a.b`` when that is a module, else ``a``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _import_base(name, path, node)
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    return {name: _imports(name, path, known) for name, path in mods.items()}


def import_loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted. A package
    importing its own submodules in ``__init__`` is not a loop unless a submodule imports the
    package back."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    loops: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                loops.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return loops


def _submodule_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Edges into a package's ``__init__`` stand for the submodules it re-exports; following
    them would make every ``from servers import X`` inside ``servers`` a false loop, so a
    package node only keeps its edges out (what it re-exports), never edges back to it from
    its own submodules."""
    out: dict[str, set[str]] = {}
    for mod, deps in graph.items():
        out[mod] = {d for d in deps if not mod.startswith(d + ".")}
    return out


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_the_import_graph_is_read_from_the_source(graph):
    # The reader sees imports inside functions (servers.engines picks a backend lazily).
    assert "servers.vllm" in graph["servers.engines"]
    assert "servers.sglang" in graph["servers.engines"]
    assert "trainer.models.resolve" in graph["trainer.models"]


def test_no_import_loops(graph):
    assert import_loops(_submodule_graph(graph)) == []


def test_a_loop_hidden_in_a_function_is_found():
    assert import_loops({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_layers_import_only_downward(graph):
    bad = [
        f"{mod} -> {dep}"
        for mod, deps in graph.items()
        for dep in deps
        if (mod.startswith("servers") and dep.split(".")[0] in ("agentloop", "trainer"))
        or (mod.startswith("agentloop") and dep.split(".")[0] == "trainer")
        or dep.split(".")[0] == "recipes"
    ]
    assert bad == []


def test_only_console_scripts_import_console_scripts(graph):
    bad = [
        f"{mod} -> {dep}"
        for mod, deps in graph.items()
        for dep in deps
        if dep.startswith("trainer.cli") and not mod.startswith("trainer.cli")
    ]
    assert bad == []


def test_servers_name_no_trainer_config_key():
    key = re.compile(r"actor_rollout_ref|reward_model\.|trainer\.[a-z_]+=|resume_mode")
    hits = [
        f"{path.relative_to(ROOT)}:{lineno}: {line.strip()}"
        for path in sorted((ROOT / "servers").rglob("*.py"))
        for lineno, line in enumerate(path.read_text().splitlines(), 1)
        if key.search(line)
    ]
    assert hits == []


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _module_aliases(name: str, path: Path, tree: ast.AST, known: set[str]) -> dict[str, str]:
    """Local names bound to another project module (``import a.b as m``, ``from a import b``)."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname and a.name in known:
                    aliases[a.asname] = a.name
                elif not a.asname and a.name.split(".")[0] in known:
                    aliases[a.name.split(".")[0]] = a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = _import_base(name, path, node)
            for a in node.names:
                if f"{base}.{a.name}" in known:
                    aliases[a.asname or a.name] = f"{base}.{a.name}"
    return {alias: mod for alias, mod in aliases.items() if mod != name}


def private_imports(modules: dict[str, Path]) -> list[str]:
    """``from x import _name``, ``import x._mod`` or ``x._name`` where ``x`` is another
    project module: a name one module keeps to itself, used by another. Imports inside
    functions count."""
    found = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        aliases = _module_aliases(name, path, tree, set(modules))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = _import_base(name, path, node)
                if base.split(".")[0] not in PACKAGES or base == name:
                    continue
                names = [f"from {base} import {a.name}" for a in node.names if _is_private(a.name)]
            elif isinstance(node, ast.Import):
                names = [
                    f"import {a.name}"
                    for a in node.names
                    if a.name.split(".")[0] in PACKAGES
                    and any(_is_private(part) for part in a.name.split("."))
                ]
            elif (
                isinstance(node, ast.Attribute)
                and _is_private(node.attr)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
            ):
                names = [f"{aliases[node.value.id]}.{node.attr}"]
            else:
                continue
            found += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names]
    return sorted(found)


def test_no_module_imports_another_modules_private_name():
    found = private_imports(_modules())
    assert found == [], (
        "these import a name another module keeps private: make it public (no leading _, a "
        "docstring, in __all__) in the module that owns it, or move it where both can use it\n"
        + "\n".join(found)
    )


def test_a_private_import_is_found(tmp_path, monkeypatch):
    pkg = tmp_path / "trainer"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("_x = 1\ny = 2\n")
    (pkg / "b.py").write_text("from trainer.a import _x, y\n")
    (pkg / "c.py").write_text("def f():\n    from .a import _x\n    return _x\n")
    (pkg / "d.py").write_text("from __future__ import annotations\n_own = 1\n")
    (pkg / "e.py").write_text("from trainer import a\nimport trainer.d as d\nz = a._x + d.y\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    modules = {_module_name(p): p for p in sorted(pkg.rglob("*.py"))}
    assert private_imports(modules) == [
        "trainer/b.py:1: from trainer.a import _x",
        "trainer/c.py:2: from trainer.a import _x",
        "trainer/e.py:3: trainer.a._x",
    ]


# The trainer's own parts, lowest first: each may import only parts listed before it (and
# itself). The tree shows the architecture: the loop sits on the workers, rewards and metrics;
# the console scripts sit on everything.
TRAINER_ORDER = (
    "algos",
    "config",
    "models",
    "data",
    "metrics",
    "workers",
    "launch",
    "rewards",
    "loop",
    "sft",
    "studio",
    "cli",
)


def _trainer_part(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "trainer" and len(parts) > 1 else None


def test_the_trainer_tree_has_only_the_listed_parts():
    top = {p.stem if p.is_file() else p.name for p in (ROOT / "trainer").iterdir()}
    top -= {"__init__", "__pycache__"}
    assert top == set(TRAINER_ORDER), (
        f"trainer/ holds {sorted(top - set(TRAINER_ORDER))} not in TRAINER_ORDER "
        f"(and lacks {sorted(set(TRAINER_ORDER) - top)}): file a new module under the part "
        "that owns it, or add a part to TRAINER_ORDER at its layer"
    )


def upward_trainer_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports from a trainer part to a part above it in ``TRAINER_ORDER``."""
    rank = {part: i for i, part in enumerate(TRAINER_ORDER)}
    return sorted(
        f"{mod} -> {dep}"
        for mod, deps in graph.items()
        for dep in deps
        if (a := _trainer_part(mod)) and (b := _trainer_part(dep)) and rank[b] > rank[a]
    )


def test_trainer_parts_import_only_downward(graph):
    assert upward_trainer_imports(graph) == []


def test_an_upward_trainer_import_is_found():
    graph = {
        "trainer.workers.fsdp_worker": {"trainer.loop.weight_sync", "trainer.config.actor"},
        "trainer.loop.ray_trainer": {"trainer.workers"},
    }
    assert upward_trainer_imports(graph) == [
        "trainer.workers.fsdp_worker -> trainer.loop.weight_sync"
    ]
