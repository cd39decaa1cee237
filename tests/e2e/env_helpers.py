"""What the environment e2e run loads by dotted path in its Ray workers."""

from __future__ import annotations

MOVES = ("up", "down", "left", "right", "stay")


def move_of(text: str) -> dict[str, str]:
    """An ``openenv.action`` function for a random tiny model: the first direction word of
    the turn, else one picked by the text's length; ``stay`` is no move the grid knows, so
    some turns are rejected by the environment (a tool error) and the episode goes on."""
    for word in text.lower().split():
        if word in MOVES[:4]:
            return {"move": word}
    return {"move": MOVES[len(text) % len(MOVES)]}
