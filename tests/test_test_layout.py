"""The tests' own layout (docs/testing.md "Where shared test code lives"): no file under tests/ imports a test
module, and the shared fixtures are the tests/fix_*.py modules that conftest.py loads through pytest_plugins.

A fixture imported from a test module is a second copy of it in the importer's namespace, and the importer runs
whatever the test module does on import; a helper there is code another test depends on without its author
knowing. Shared code lives in tests/fix_*.py (fixtures, loaded through pytest_plugins) or in a helper module whose
name does not start with test_.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, dotted name) of every module an import statement names, at any depth (inside functions too); a
    `from tests import x` names tests.x."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
        elif isinstance(
            node, ast.ImportFrom
        ):  # relative: from .test_x import y, from . import test_x
            found += [
                (node.lineno, f"{'.' * node.level}{node.module or ''}.{alias.name}")
                for alias in node.names
            ]
            if node.module:
                found.append((node.lineno, f"{'.' * node.level}{node.module}"))
    return found


def imports_of_test_modules(source: str) -> list[str]:
    """`line N: name` of each import in SOURCE that names a test module (tests.test_*, or test_* relatively)."""
    found = []
    for line, name in imported_modules(ast.parse(source)):
        if not (name.startswith("tests.") or name.startswith(".")):
            continue
        parts = name.lstrip(".").split(".")
        test_module = next(
            (
                ".".join(parts[: i + 1])
                for i, part in enumerate(parts[:2])
                if part.startswith("test_")
            ),
            None,
        )
        if test_module is not None and f"line {line}: {test_module}" not in found:
            found.append(f"line {line}: {test_module}")
    return found


def test_no_file_under_tests_imports_a_test_module():
    found = {}
    for path in sorted(TESTS.rglob("*.py")):
        if bad := imports_of_test_modules(path.read_text()):
            found[str(path.relative_to(TESTS.parent))] = bad
    assert found == {}, (
        f"import the shared code from a tests/fix_*.py or helper module instead: {found}"
    )


def test_the_check_sees_each_spelling_of_an_import_of_a_test_module():
    for source in (
        "from tests.test_mcp import serving",
        "import tests.test_mcp",
        "def f():\n    from tests.test_search import scan_witness",
        "from tests import test_mcp",
        "from .test_mcp import serving",
        "from . import test_mcp",
    ):
        assert imports_of_test_modules(source), source
    for source in (
        "from tests.fix_mcp import serving",
        "from tests.installed import memctl_exe",
        "import pytest",
        "from tests import steps",
        "from memctl.reading import search",
    ):
        assert imports_of_test_modules(source) == [], source


def test_pytest_plugins_loads_every_fix_module_and_only_those():
    tree = ast.parse((TESTS / "conftest.py").read_text())
    declared = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "pytest_plugins" for t in node.targets)
    ]
    assert len(declared) == 1, "conftest.py declares pytest_plugins once"
    plugins = ast.literal_eval(declared[0])
    assert sorted(plugins) == sorted(f"tests.{p.stem}" for p in TESTS.glob("fix_*.py"))
