"""``multi_turn.interaction_config_path``: verl's interaction YAML, loaded as verl loads it.

```yaml
interaction:
  - name: gsm8k                      # optional: the class name without "Interaction", lowered
    class_name: my_pkg.users.Gsm8kInteraction
    config: {}                       # given to the class as cls(config={...config, name})
```

A row picks one with ``extra_info.interaction_kwargs.name``; the whole
``interaction_kwargs`` mapping goes to ``start_interaction`` and ``generate_response``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from servers.user_code import load_object

__all__ = ["load_interactions", "row_interaction"]

KEY = "actor_rollout_ref.rollout.multi_turn.interaction_config_path"


def load_interactions(path: str | Path) -> dict[str, Any]:
    """Every interaction of the YAML, constructed; returns name -> instance. Raises
    ``ValueError`` naming the entry for a missing file, a bad layout, a class that does not
    import or has no ``generate_response``, and a duplicate name."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{KEY}: {str(path)!r} does not exist")
    data = yaml.safe_load(path.read_text()) or {}
    entries = data.get("interaction") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{path}: expected a top-level 'interaction:' list with one entry or more")
    out: dict[str, Any] = {}
    for i, entry in enumerate(entries):
        where = f"{path}: interaction[{i}]"
        if not isinstance(entry, Mapping) or not isinstance(entry.get("class_name"), str):
            raise ValueError(f"{where} needs class_name (a dotted path like pkg.module.Class)")
        cls = load_object(entry["class_name"], key=f"{where}.class_name")
        if not callable(getattr(cls, "generate_response", None)):
            raise ValueError(
                f"{where}: {entry['class_name']} has no generate_response method; an "
                "interaction implements verl's BaseInteraction API (agentloop.interactions."
                "Interaction)"
            )
        name = entry.get("name") or _default_name(entry["class_name"])
        if name in out:
            raise ValueError(f"{where}: an interaction named {name!r} is already configured")
        config = entry.get("config") or {}
        if not isinstance(config, Mapping):
            raise ValueError(f"{where}: config must be a mapping, got {config!r}")
        try:
            out[name] = cls(config={**config, "name": name})
        except Exception as exc:
            raise ValueError(
                f"{where}: {entry['class_name']}(config=...) raised {type(exc).__name__}: {exc}"
            ) from exc
    return out


def _default_name(class_name: str) -> str:
    """verl's default: the class name without an ``Interaction`` suffix, lowered (the name
    after the last ``.`` or ``:``, however the class is named)."""
    simple = class_name.replace(":", ".").rsplit(".", 1)[-1]
    return (simple[: -len("Interaction")] if simple.endswith("Interaction") else simple).lower()


def row_interaction(row: Mapping[str, Any], names: list[str]) -> tuple[str, dict[str, Any]]:
    """The interaction a row picks and its kwargs (``extra_info.interaction_kwargs``, or a
    top-level ``interaction_kwargs``). Raises ``ValueError`` saying what the row lacks."""
    kwargs = row.get("interaction_kwargs")
    extra = row.get("extra_info")
    if kwargs is None and isinstance(extra, Mapping):
        kwargs = extra.get("interaction_kwargs")
    configured = ", ".join(names)
    if not isinstance(kwargs, Mapping) or "name" not in kwargs:
        raise ValueError(
            "has no extra_info.interaction_kwargs.name: with interactions configured "
            f"({configured}; {KEY}), each tool_agent row names the one it talks to"
        )
    if kwargs["name"] not in names:
        raise ValueError(
            f"names interaction {kwargs['name']!r} in extra_info.interaction_kwargs, which is "
            f"not configured; configured: {configured} ({KEY})"
        )
    return str(kwargs["name"]), dict(kwargs)
