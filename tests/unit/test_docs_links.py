"""Every relative link in the front door (README.md), docs/ and the folder READMEs points at a
file that exists, and every ``#anchor`` at a heading of that file (GitHub's slugs)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _markdown_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for sub in ("tests", "recipes", "examples", "docker"):
        files += sorted((ROOT / sub).rglob("README.md"))
    return files


def _prose_lines(path: Path, blank_code: bool = True):
    """(line number, text) outside fenced code blocks, code spans blanked unless told."""
    fence = False
    for no, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("```"):
            fence = not fence
            continue
        if not fence:
            yield no, re.sub(r"`[^`]*`", "``", line) if blank_code else line


def _slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    out: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in _prose_lines(path, blank_code=False):  # slugs keep code-span text
        if line.startswith("#"):
            slug = _slug(line.lstrip("#"))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_links(files: list[Path], root: Path = ROOT) -> list[str]:
    bad = []
    for f in files:
        for no, line in _prose_lines(f):
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target):
                    continue  # http(s), mailto
                path, _, anchor = target.partition("#")
                dest = (f.parent / path).resolve() if path else f
                where = f"{f.relative_to(root)}:{no}"
                if not dest.exists():
                    bad.append(f"{where}: {target} (no such file)")
                elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                    bad.append(f"{where}: {target} (no heading #{anchor})")
    return bad


def test_every_relative_link_resolves():
    files = _markdown_files()
    assert len(files) > 10
    assert broken_links(files) == []


def test_a_broken_file_or_anchor_is_reported(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n[ok](#title) [gone](missing.md) [bad](#nope)\n```\n[x](no.md)\n```\n")
    assert broken_links([page], tmp_path) == [
        "page.md:2: missing.md (no such file)",
        "page.md:2: #nope (no heading #nope)",
    ]


def test_the_readme_is_a_front_door():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250
