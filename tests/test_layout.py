"""The house's layers, read from memctl's source: every import goes to its own layer or one below.

Lowest first: the base modules (memctl/*.py and memctl/redact/), the database (memctl/db/), the write path
(memctl/write/), the memory records (memctl/records/), ingest, runbooks, embedding, reading, recall, backup,
retention, transfer, observe, reembed (each memctl/<name>/), the MCP server (memctl/mcp/), and the CLI
(memctl/cli/, with memctl/__main__.py).
Imports inside functions count as much as those at the top: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import memctl

PACKAGE = Path(memctl.__file__).parent
LAYERS = ("base", "db", "write", "records", "ingest", "runbooks", "embedding", "reading", "recall", "backup",
          "retention", "transfer", "observe", "reembed", "mcp", "cli")
MAX_LINES = 500
# Subpackages whose __init__ is their API: the others hold a docstring and import nothing, so that
# importing one module of a package never loads its siblings (start-up cost, tests/bench/startup.py).
API_PACKAGES = {"memctl.db", "memctl.redact", "memctl.cli"}


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def layer(module: str) -> int:
    """A module's layer: its subpackage's, or base for memctl itself and its top-level modules."""
    if module == "memctl.__main__":
        return LAYERS.index("cli")
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in LAYERS:
        return LAYERS.index(parts[1])
    return LAYERS.index("base")


def _imported(name: str, path: Path) -> set[str]:
    """The memctl modules a module imports, anywhere in it (`from memctl import db` is memctl.db)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "memctl")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            if base.split(".")[0] != "memctl":
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in MODULES else base)
    return {module for module in found if module != name}


EDGES = {name: _imported(name, path) for name, path in MODULES.items()}


def test_the_layers_cover_every_subpackage():
    packages = {p.parent.name for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE}
    assert packages - {"redact"} <= set(LAYERS), f"a subpackage without a layer: {packages - set(LAYERS)}"
    assert set(LAYERS) - {"base"} <= packages


def test_no_import_goes_up_a_layer():
    upward = sorted(f"{name} ({LAYERS[layer(name)]}) imports {target} ({LAYERS[layer(target)]})"
                    for name, targets in EDGES.items() for target in targets if layer(target) > layer(name))
    assert not upward, "imports against the layers (" + " < ".join(LAYERS) + "):\n" + "\n".join(upward)


def test_the_check_sees_an_upward_import():
    assert layer("memctl.write.gate") < layer("memctl.embedding.models") < layer("memctl.observe.size")
    assert layer("memctl.redact.detect") == layer("memctl.errors") == 0
    assert layer("memctl.__main__") == layer("memctl.cli.common") == len(LAYERS) - 1
    assert "memctl.db.locks" in EDGES["memctl.embedding.models"]  # `from memctl.db import locks`
    assert "memctl.write.gate" in EDGES["memctl.write.store"]  # `from memctl.write.gate import ...`


def test_no_import_circles():
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(module: str) -> None:  # Tarjan's strongly connected components
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in EDGES.get(module, ()):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == module:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in MODULES:
        if module not in index:
            visit(module)
    assert circles == [], f"import circles: {circles}"


def test_no_module_over_500_lines():
    long = {name: n for name, path in MODULES.items() if (n := len(path.read_text(encoding="utf-8").splitlines()))
            > MAX_LINES}
    assert long == {}, f"modules over {MAX_LINES} lines: split them by concern"


def test_subpackages_say_what_they_hold_and_load_nothing():
    for name, path in MODULES.items():
        if path.name != "__init__.py" or name == "memctl" or name in API_PACKAGES:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        assert ast.get_docstring(tree), f"{name}: say what the package holds and what it may import"
        imports = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                   and not (isinstance(node, ast.ImportFrom) and node.module == "__future__")]
        assert not imports, f"{name}/__init__.py imports: importing one of its modules would load the others"


def test_search_starts_without_the_write_path():
    """`memctl episode search` (and every command of its module) imports neither the episode log's write
    path nor redaction (the gate's detectors, the repeats fold): some 30 ms of every search's start."""
    import subprocess
    import sys

    write_path = ("memctl.records.episodes", "memctl.write.store", "memctl.write.repeats", "memctl.redact")
    code = ("import sys, memctl.cli.episode, memctl.reading.search, memctl.recall.recall; "
            f"print(sorted(set({write_path!r}) & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_reading_a_fact_starts_without_the_write_path():
    """`memctl fact get` (and list, history) imports neither the gate, redaction, the store nor the episode
    log: some 25 ms of a 200 ms start (tests/bench/startup.py, goal 1.5x a bare connect)."""
    import subprocess
    import sys

    write_path = ("memctl.write.gate", "memctl.write.store", "memctl.records.episodes", "memctl.redact")
    code = ("import sys, memctl.cli.fact, memctl.records.facts as f; f.moment('3d', 'as_of'); "
            "f.moment('2026-08-11T03:10:00Z', 'as_of'); "
            f"print(sorted(set({write_path!r}) & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
