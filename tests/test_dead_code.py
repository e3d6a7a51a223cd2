"""No dead code in memctl: vulture (a test dependency) finds every function, class, variable and attribute
that nothing uses; what it cannot see used is named, with the reason, in tests/dead_code_whitelist.py.

Found this way and removed (issue 43): episodes.chunk_size and chunks_of, sources.check_allowed,
errors.ModelMismatch, search(accessed_recency=...), episodes.delete, ingest.lines_of, logformats.FORMATS,
statement.TS_CONFIG and cli.erasure.check_receipt.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import memctl

vulture = pytest.importorskip(
    "vulture", reason="the test extra installs vulture: pip install -e '.[test]'"
)

PACKAGE = Path(memctl.__file__).parent
WHITELIST = Path(__file__).with_name("dead_code_whitelist.py")
# Typer registers a command by its decorator: the function is used though nothing calls it by name.
REGISTERED = ["@*.command", "@*.callback"]


def unused(*paths: Path) -> list[str]:
    finder = vulture.Vulture(ignore_decorators=REGISTERED)
    finder.scavenge([str(path) for path in paths])
    return [
        f"{item.filename}:{item.first_lineno}: {item.message}"
        for item in finder.get_unused_code(min_confidence=60)
    ]


def test_no_dead_code():
    found = unused(PACKAGE, WHITELIST)
    assert found == [], (
        "dead code (remove it, or name it in tests/dead_code_whitelist.py with why it is used):\n"
        + "\n".join(found)
    )


def test_the_check_sees_dead_code(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import typer\napp = typer.Typer()\n\n\ndef used():\n    return 1\n\n\ndef chunks_of(text):\n"
        "    return [text]\n\n\n@app.command()\ndef show():\n    return used()\n",
        encoding="utf-8",
    )
    assert [line.split(": ", 1)[1] for line in unused(sample)] == ["unused function 'chunks_of'"]
