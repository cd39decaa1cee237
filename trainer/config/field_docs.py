"""The docstrings under a dataclass's fields (the string literal after each annotated field,
read from the class source with ``ast``): the comments of the generated YAML files
(``trainer.config.generate``) and the help of ``agentloop-serve``'s flags
(``trainer.cli.flags``). Imports nothing beyond the standard library."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
from pathlib import Path

__all__ = ["field_docs"]


@functools.cache
def _module_tree(path: str) -> ast.Module:
    return ast.parse(Path(path).read_text(), filename=path)


def _own_docs(cls: type) -> dict[str, str]:
    """The docstrings under the fields that ``cls``'s own class body writes."""
    source = inspect.getsourcefile(cls)
    assert source is not None, cls
    body = next(
        node.body
        for node in _module_tree(source).body
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__
    )
    docs: dict[str, str] = {}
    for node, after in zip(body, body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring; a field a subclass writes again without one keeps its base's."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update(_own_docs(klass))
    return docs
