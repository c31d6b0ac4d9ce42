"""The documentation holds together: every relative link in README.md and docs/ (and the other READMEs) resolves to a
file (and to a heading, for `#anchor` links), the benchmark tables spliced into the docs equal the files they are
generated from, README.md stays short, and no file points outside the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.environment import REPO_ROOT

PAGES = sorted([REPO_ROOT / "README.md", *(REPO_ROOT / "docs").glob("*.md"), REPO_ROOT / "benchmarks" / "README.md",
                REPO_ROOT / "model_cards" / "README.md"])  # fmt: skip
#: Pages that README.md links to and another change adds. A page leaves this set once it exists (the test below fails
#: until then), so a link to a page that was never written cannot hide here.
NOT_YET_WRITTEN: set[str] = set()
README_MAX_LINES = 400
GENERATED = re.compile(
    r"(<!-- BEGIN GENERATED: (benchmarks/results/[\w.]+\.md) -->\n)(.*?)(<!-- END GENERATED -->)", re.S
)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The text without fenced code blocks and inline code, where `[x](y)` is not a link."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    anchors, seen = set(), {}
    for heading in re.findall(r"^#{1,6} (.+)$", _prose(page.read_text(encoding="utf-8")), flags=re.M):
        slug = _slug(heading)
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def _relative_links(page: Path) -> list[str]:
    links = LINK.findall(_prose(page.read_text(encoding="utf-8")))
    return [link for link in links if not re.match(r"[a-z]+:", link)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for link in _relative_links(page):
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if str(target.relative_to(REPO_ROOT)) in NOT_YET_WRITTEN and not target.exists():
            continue
        if not target.exists():
            broken.append(f"{link}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
            broken.append(f"{link}: no heading #{anchor}")
    assert not broken, broken


def test_pages_not_yet_written_are_still_missing():
    written = sorted(name for name in NOT_YET_WRITTEN if (REPO_ROOT / name).exists())
    assert not written, f"{written} exist now: remove them from NOT_YET_WRITTEN so their links are checked"


def test_generated_blocks_equal_their_result_files():
    """Each `<!-- BEGIN GENERATED: benchmarks/results/NAME.md -->` block holds that file byte for byte (as
    `python -m benchmarks.report` splices it), so no number in the docs is typed by hand."""
    blocks = []
    for page in PAGES:
        for match in GENERATED.finditer(page.read_text(encoding="utf-8")):
            source = (REPO_ROOT / match.group(2)).read_text(encoding="utf-8")
            assert match.group(3) == source.rstrip() + "\n", (page.name, match.group(2))
            blocks.append(match.group(2))
    assert len(blocks) >= 4, blocks  # sample efficiency, overhead, claims, stress


def test_readme_is_short_and_holds_the_two_commands():
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    assert "pip install -e . && accelerate launch examples/train_echo.py" in text  # the main job
    assert 'pip install -e ".[dev]" && python -m pytest -q tests' in text  # the tests


def test_no_file_points_outside_the_repository():
    """Nothing in the repository names a path on the machine it was written on or a document kept outside it."""
    outside = re.compile("|".join([r"/w" + r"ork/", r"\.\./sha" + "red", r"\bSP" + r"EC\b"]))
    suffixes = {".py", ".md", ".toml", ".yaml", ".yml", ".ipynb", ".cfg", ".txt"}
    hits = []
    for path in sorted(REPO_ROOT.rglob("*")):
        parts = path.relative_to(REPO_ROOT).parts
        if (
            path.is_file()
            and path.suffix in suffixes
            and not any(p.startswith(".") or p in ("outputs",) for p in parts)
        ):
            hits += [f"{path.relative_to(REPO_ROOT)}: {m.group(0)}" for m in outside.finditer(path.read_text("utf-8"))]
    assert not hits, hits
