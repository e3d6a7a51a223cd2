"""Typed settings (memctl.schema): each setting defined once, read as an attribute, a misspelt name an error.

The checks here need no database: the schema against itself (defaults pass their checks), against `config show`,
and against the source, where every `settings.<section>.<name>` must name a setting of the schema.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import memctl
from memctl import config

ROOT = Path(__file__).resolve().parent.parent  # the checkout (memctl may be installed elsewhere)
# The names the code gives a Settings object (memctl.cli.systemd calls it config; the CLI, st): a chain
# <one of them>.<section>.<name> is a setting; <settings>.<name> a top-level one (only the name settings: st and
# config name other things too).
SETTINGS_NAMES = {"settings", "st", "config", "loaded", "off", "bare"}


def test_a_misspelt_setting_fails_read_written_or_given():
    settings = config.load(Path("/dev/null"), environ={})
    assert settings.embedding.batch_size == 32
    with pytest.raises(AttributeError):
        settings.embedding.batch_sise  # noqa: B018  (the read is the test)
    with pytest.raises(AttributeError):
        settings.databse_url  # noqa: B018
    with pytest.raises(AttributeError, match="batch_sise"):
        settings.embedding.batch_sise = 64
    with pytest.raises(AttributeError, match="serach"):
        settings.serach = config.Search()
    with pytest.raises(TypeError, match="fusoin"):
        config.Search(fusoin="rrf")
    assert settings.embedding.batch_size == 32


def test_settings_made_in_code_hold_every_default():
    """No fallback helpers: a Settings() is the schema's defaults, as a load of an empty file is."""
    bare, loaded = config.Settings(), config.load(Path("/dev/null"), environ={})
    for section, name, value in bare.items():
        assert value == (
            config.SCHEMA[section][name].default
            if section in config.SCHEMA
            else config.DEFAULT_IMPORTANCE[name]
        )
    assert list(bare.items()) == list(loaded.items())


def test_each_default_passes_its_own_check_and_type():
    for section, keys in config.SCHEMA.items():
        for name, spec in keys.items():
            assert (spec.section, spec.name) == (section, name)
            assert spec.doc, f"{section}.{name}: no doc"
            if spec.default is None:
                assert "None" in spec.type and spec.example, (
                    f"{section}.{name}: unset without an example"
                )
            else:
                assert "None" not in spec.type, f"{section}.{name}: a default, yet typed optional"
                assert spec.check(spec.default) == spec.default, f"{section}.{name}"


def test_every_section_is_an_attribute_of_settings():
    annotated = config.Settings.__annotations__
    assert set(config.SECTIONS) <= set(annotated)
    assert all(annotated[name] == cls.__name__ for name, cls in config.SECTIONS.items())


def test_config_show_lists_exactly_the_schema():
    shown = {row["setting"] for row in config.shown_settings(config.Settings())}
    expected = {f"{s}.{n}" if s else n for s, keys in config.SCHEMA.items() for n in keys}
    expected |= {f"importance.{k}" for k in config.DEFAULT_IMPORTANCE}
    expected |= {f"retention.{k}" for k in config.RETENTION_DEFAULTS}
    assert shown == expected


def _name(node: ast.expr) -> str | None:
    return (
        node.id
        if isinstance(node, ast.Name)
        else node.attr
        if isinstance(node, ast.Attribute)
        else None
    )


TOP = set(dir(config.Settings)) | set(config.Settings.__annotations__)


def unknown_settings(source: str, where: str = "<source>") -> list[str]:
    """`settings.<section>.<name>` and `settings.<name>` chains whose names the schema does not define."""
    found = []
    tree = ast.parse(source)
    hypothesis = any(
        isinstance(n, ast.ImportFrom)
        and n.module == "hypothesis"
        and any(a.name == "settings" for a in n.names)
        for n in ast.walk(tree)
    )  # its settings are not memctl's
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        owner, base = _name(node.value), node.value
        if owner == "settings" and not hypothesis and node.attr not in TOP:
            found.append(f"{where}:{node.lineno}: {owner}.{node.attr}")
        elif (
            owner in config.SECTIONS
            and isinstance(base, ast.Attribute)
            and _name(base.value) in SETTINGS_NAMES
            and node.attr not in dir(config.SECTIONS[owner]) + list(config.SECTIONS[owner].schema)
        ):
            found.append(f"{where}:{node.lineno}: {_name(base.value)}.{owner}.{node.attr}")
    return found


def test_every_setting_the_source_reads_is_in_the_schema():
    planted = unknown_settings(
        "settings.embedding.batch_sise\nst.search.fusoin\nself.settings.recall.window_gapp\n"
        "settings.databse_url\nsettings.search.fusion\n"
    )
    assert len(planted) == 4, planted  # the check finds a misspelling where no test runs the line
    files = [*sorted((ROOT / "memctl").rglob("*.py")), *sorted((ROOT / "tests").rglob("*.py"))]
    files.remove(Path(__file__).resolve())  # its misspellings are on purpose
    found = [
        f
        for path in files
        for f in unknown_settings(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    ]
    assert not found, "settings the schema does not define:\n" + "\n".join(found)
