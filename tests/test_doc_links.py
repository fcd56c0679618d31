"""Every relative link in README.md and docs/*.md names a file that exists and, with a
#fragment into a Markdown file, a heading that file has (GitHub's anchors)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"(?<!!)\[([^\]\n]*)\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The text outside fenced code blocks (a `#` there is a comment, not a heading)."""
    return _FENCE.sub("", text)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: links reduced to their text, lower case, everything
    but letters, digits, `_`, `-` and spaces dropped, spaces turned into hyphens."""
    text = _LINK.sub(r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(path.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"#{1,6} (.+)", line)
        if not m:
            continue
        base = anchor(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")  # a repeated heading gets -1, -2, ...
    return out


def links(path: Path) -> list[str]:
    # Inline code may show link syntax as an example; only real links are checked.
    prose = _CODE.sub("", _prose(path.read_text(encoding="utf-8")))
    return [target for _, target in _LINK.findall(prose)]


def broken(path: Path) -> list[str]:
    out = []
    for target in links(path):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check
            continue
        file, _, fragment = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            out.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            out.append(f"{target}: no heading with that anchor in {dest.name}")
    return out


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_every_relative_link_resolves(path: Path) -> None:
    assert links(path) or path.name != "README.md"  # the README links its docs
    assert broken(path) == []


def test_the_checker_finds_a_missing_file_and_a_missing_anchor(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Step logs → training table\n\n## `--dry_run`\n")
    page.write_text(
        "# Top\n\n```bash\n# not a heading\n```\n"
        "[a](other.md#step-logs--training-table) [b](other.md#--dry_run) [c](#top)\n"
        "[d](gone.md) [e](other.md#nope) [f](#not-a-heading) `[g](ignored.md)`\n"
        "[h](https://example.com/x.md)\n"
    )
    assert broken(page) == [
        "gone.md: no such file",
        "other.md#nope: no heading with that anchor in other.md",
        "#not-a-heading: no heading with that anchor in page.md",
    ]
