"""README.md is the entry point and docs/ holds the long pages: every relative link resolves, to a file and,
when it names one, to a heading there; the README's two fenced blocks stay where CI and operators read them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens (code fences skipped)."""
    found, fence = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)
    return [target for target in LINK.findall(text) if not re.match(r"[a-z]+:", target)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page):
        file, _, anchor = target.partition("#")
        where = (page.parent / file).resolve() if file else page
        if not where.exists():
            broken.append(f"{target}: no file {where}")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            broken.append(f"{target}: no heading #{anchor} in {where.name}")
    assert not broken, f"{page.name}: " + "; ".join(broken)


def test_the_readme_is_an_entry_point():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 350
    for section in ("## Quickstart", "## Tests", "## Commands", "## Exit codes", "## Architecture"):
        assert f"\n{section}\n" in text, section
    assert all((ROOT / "docs" / p).exists() for p in re.findall(r"\(docs/([\w.-]+\.md)", text))
    assert len(re.findall(r"\(docs/[\w.-]+\.md", text)) >= 15  # every page is reachable from here


def test_the_configuration_reference_is_the_schema_s():
    """docs/configuration.md's TOML block is memctl.config.reference(): a setting documented and not in the schema,
    or in the schema and not documented, or documented with another default or variable, fails here."""
    from memctl import config

    page = (ROOT / "docs" / "configuration.md").read_text()
    block = page.split("```toml\n", 1)[1].split("```\n", 1)[0]
    assert block == config.reference(), (
        "docs/configuration.md's block differs from the schema: print it with "
        "python -c 'from memctl import config; print(config.reference())'"
    )
    for section, keys in config.SCHEMA.items():
        for name in keys:
            assert f"{name} = " in block, f"{section}.{name} undocumented"
