"""A generated world for retrieval QA: passages about fictional cities and people (so no
model knows the answers) and questions over them, one-hop (NQ-like) and two-hop
(HotpotQA-like: a person's birthplace, then a fact about that city)."""

from __future__ import annotations

import random
from typing import Any

__all__ = ["make_world"]

_SYLLABLES = ["ka", "lo", "mir", "ven", "dra", "sel", "to", "ri", "an", "bel", "cor", "ul", "zen"]
_JOBS = ["painter", "engineer", "botanist", "sailor", "composer", "cartographer", "baker"]


def _name(rng: random.Random, parts: int, used: set[str]) -> str:
    while True:
        name = "".join(rng.choice(_SYLLABLES) for _ in range(parts)).capitalize()
        if name not in used:
            used.add(name)
            return name


def make_world(
    seed: int = 0, countries: int = 6, cities: int = 24, people: int = 60
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(passages ``{id, title, contents}``, questions ``{question, answers, hops}``)."""
    rng = random.Random(seed)
    used: set[str] = set()
    nations = [_name(rng, 3, used) + "ia" for _ in range(countries)]
    towns = []
    for _ in range(cities):
        town = {
            "name": _name(rng, 2, used),
            "country": rng.choice(nations),
            "river": _name(rng, 2, used),
            "founded": rng.randint(900, 1900),
        }
        towns.append(town)
    passages, questions = [], []
    for t in towns:
        passages.append(
            {
                "title": t["name"],
                "contents": f"{t['name']} is a city in {t['country']}. It was founded in "
                f"{t['founded']} on the banks of the {t['river']} river.",
            }
        )
        questions.append(
            {
                "question": f"In which country is the city of {t['name']}?",
                "answers": [t["country"]],
                "hops": 1,
            }
        )
        questions.append(
            {
                "question": f"In what year was {t['name']} founded?",
                "answers": [str(t["founded"])],
                "hops": 1,
            }
        )
    for _ in range(people):
        first, last = _name(rng, 2, used), _name(rng, 2, used)
        person, town, job = f"{first} {last}", rng.choice(towns), rng.choice(_JOBS)
        passages.append(
            {
                "title": person,
                "contents": f"{person} is a {job} who was born in {town['name']} in "
                f"{rng.randint(1900, 2000)}.",
            }
        )
        questions.append(
            {"question": f"What is the profession of {person}?", "answers": [job], "hops": 1}
        )
        questions.append(
            {
                "question": f"In which country was {person} born?",
                "answers": [town["country"]],
                "hops": 2,
            }
        )
        questions.append(
            {
                "question": f"On which river is the city where {person} was born?",
                "answers": [town["river"], f"{town['river']} river"],
                "hops": 2,
            }
        )
    for i, p in enumerate(passages):
        p["id"] = str(i)
    rng.shuffle(questions)
    return passages, questions
