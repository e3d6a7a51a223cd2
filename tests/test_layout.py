"""The house's layers, read from memctl's source: every import goes to its own layer or one below.

Lowest first: the base modules (memctl/*.py, memctl/files/ and memctl/redact/), the database (memctl/db/), the write path
(memctl/write/), the memory records (memctl/records/), ingest, runbooks, embedding, reading, recall, backup,
upgrade, retention, transfer, observe, reembed (each memctl/<name>/), the MCP server (memctl/mcp/), and the CLI
(memctl/cli/, with memctl/__main__.py).
Imports inside functions count as much as those at the top: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import memctl

PACKAGE = Path(memctl.__file__).parent
LAYERS = (
    "base",
    "db",
    "write",
    "records",
    "ingest",
    "runbooks",
    "embedding",
    "reading",
    "recall",
    "backup",
    "upgrade",
    "retention",
    "transfer",
    "observe",
    "reembed",
    "mcp",
    "cli",
)
MAX_LINES = 700  # as ruff writes them at 100 columns ([tool.ruff]): the 500 packed lines of before, formatted
MAX_MODULES = (
    10  # .py files of one package, its __init__ included: a room a reader can name at a glance
)
CROWDED = {"memctl.cli"}  # one module per noun of the command line
# Subpackages whose __init__ is their API: the others hold a docstring and import nothing, so that
# importing one module of a package never loads its siblings (start-up cost, tests/bench/startup.py).
API_PACKAGES = {"memctl.db", "memctl.redact", "memctl.cli", "memctl.files"}


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
    assert packages - {"redact", "files"} <= set(LAYERS), (
        f"a subpackage without a layer: {packages - set(LAYERS)}"
    )
    assert set(LAYERS) - {"base"} <= packages


def test_no_import_goes_up_a_layer():
    upward = sorted(
        f"{name} ({LAYERS[layer(name)]}) imports {target} ({LAYERS[layer(target)]})"
        for name, targets in EDGES.items()
        for target in targets
        if layer(target) > layer(name)
    )
    assert not upward, (
        "imports against the layers (" + " < ".join(LAYERS) + "):\n" + "\n".join(upward)
    )


def test_the_check_sees_an_upward_import():
    assert (
        layer("memctl.write.gate") < layer("memctl.embedding.models") < layer("memctl.observe.size")
    )
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
    long = {
        name: n
        for name, path in MODULES.items()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}, f"modules over {MAX_LINES} lines: split them by concern"


def test_no_package_over_10_modules():
    sizes = {
        name: len(list(path.parent.glob("*.py")))
        for name, path in MODULES.items()
        if path.name == "__init__.py"
    }
    crowded = {name: n for name, n in sizes.items() if n > MAX_MODULES and name not in CROWDED}
    assert crowded == {}, (
        f"packages over {MAX_MODULES} modules: split them by concern, each a room a reader can name"
    )


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def reach_ins(name: str, path: Path) -> list[str]:
    """Where a module takes another module's private name: `from memctl.x import _y`, or `x._y` (and
    `memctl.x._y`) on a memctl module it imported; its own private names are its business."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    bound: dict[str, str] = {}  # a local name -> the memctl module it is
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "memctl":
                    bound[alias.asname or alias.name.split(".")[0]] = (
                        alias.name if alias.asname else "memctl"
                    )
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            if base.split(".")[0] != "memctl" or base == name:
                continue
            for alias in node.names:
                if _private(alias.name):
                    found.append(
                        (node.lineno, f"{name}:{node.lineno}: from {base} import {alias.name}")
                    )
                elif f"{base}.{alias.name}" in MODULES:
                    bound[alias.asname or alias.name] = f"{base}.{alias.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            chain, value = [], node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in bound:
                module = ".".join([bound[value.id], *reversed(chain)])
                if module in MODULES and module != name:
                    found.append((node.lineno, f"{name}:{node.lineno}: {module}.{node.attr}"))
    return [where for _, where in sorted(found)]


def test_no_module_reaches_into_another_modules_private_names():
    found = [where for name, path in MODULES.items() for where in reach_ins(name, path)]
    assert found == [], (
        "private names used outside their module (make a public function where another room "
        "needs one):\n" + "\n".join(found)
    )


def test_the_check_sees_a_reach_in(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from memctl.db import embedded\nfrom memctl.records.facts import _vacuum\nimport memctl.db.serve\n"
        "embedded._wait(1)\nmemctl.db.serve._x\nembedded.public\nembedded.__name__\n",
        encoding="utf-8",
    )
    assert reach_ins("memctl.sample", sample) == [
        "memctl.sample:2: from memctl.records.facts import _vacuum",
        "memctl.sample:4: memctl.db.embedded._wait",
        "memctl.sample:5: memctl.db.serve._x",
    ]


HANDLE = "memctl.db.memory"  # the one module that sets what a connection carries (Memory's methods)


def _a_connection(node: ast.AST) -> bool:
    """A name or attribute that holds a connection by its name: conn, read_conn, self.conn, primary_connection."""
    named = (
        node.id
        if isinstance(node, ast.Name)
        else node.attr
        if isinstance(node, ast.Attribute)
        else ""
    )
    return named.endswith(("conn", "connection"))


def stuck_on(name: str, path: Path) -> list[str]:
    """Where a module sets an attribute on a connection (conn.x = ..., setattr(conn, ...), del conn.x), or reads
    one with getattr: state a psycopg object would carry in secret instead of the handle's declared attributes."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        targets = (
            node.targets
            if isinstance(node, (ast.Assign, ast.Delete))
            else [node.target]
            if isinstance(node, (ast.AugAssign, ast.AnnAssign))
            else []
        )
        for target in targets:
            for part in ast.walk(target):
                if isinstance(part, ast.Attribute) and _a_connection(part.value):
                    found.append(f"{name}:{part.lineno}: .{part.attr} set")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("setattr", "getattr", "delattr")
            and node.args
            and _a_connection(node.args[0])
        ):
            found.append(f"{name}:{node.lineno}: {node.func.id}()")
    return found


def test_nothing_is_stuck_onto_a_connection():
    found = [
        where for name, path in MODULES.items() if name != HANDLE for where in stuck_on(name, path)
    ]
    assert found == [], (
        "attributes set on a connection outside memctl.db.memory (declare them on Memory, "
        "changed by its methods):\n" + "\n".join(found)
    )


def test_the_check_sees_an_attribute_stuck_on(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "conn.memctl_role = 'r'\nread_conn.route, x = 1, 2\nself.conn.gates += [1]\n"
        "getattr(conn, 'memctl_role', None)\nsetattr(read_conn, 'a', 1)\nself.conn = conn\n"
        "conn.execute('x')\nstate.value = conn\n",
        encoding="utf-8",
    )
    assert stuck_on("memctl.sample", sample) == [
        "memctl.sample:1: .memctl_role set",
        "memctl.sample:2: .route set",
        "memctl.sample:3: .gates set",
        "memctl.sample:4: getattr()",
        "memctl.sample:5: setattr()",
    ]


def test_subpackages_say_what_they_hold_and_load_nothing():
    for name, path in MODULES.items():
        if path.name != "__init__.py" or name == "memctl" or name in API_PACKAGES:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        assert ast.get_docstring(tree), f"{name}: say what the package holds and what it may import"
        imports = [
            node
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom))
            and not (isinstance(node, ast.ImportFrom) and node.module == "__future__")
        ]
        assert not imports, (
            f"{name}/__init__.py imports: importing one of its modules would load the others"
        )


def test_search_starts_without_the_write_path():
    """`memctl episode search` (and every command of its module) imports neither the episode log's write
    path nor redaction (the gate's detectors, the repeats fold): some 30 ms of every search's start."""
    import subprocess
    import sys

    write_path = (
        "memctl.records.episodes",
        "memctl.write.store",
        "memctl.write.repeats",
        "memctl.redact",
    )
    code = (
        "import sys, memctl.cli.episode, memctl.reading.search, memctl.recall.recall; "
        f"print(sorted(set({write_path!r}) & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_reading_a_fact_starts_without_the_write_path():
    """`memctl fact get` (and list, history) imports neither the gate, redaction, the store nor the episode
    log: some 25 ms of a 200 ms start (tests/bench/startup.py, goal 1.5x a bare connect)."""
    import subprocess
    import sys

    write_path = (
        "memctl.write.gate",
        "memctl.write.store",
        "memctl.records.episodes",
        "memctl.redact",
    )
    code = (
        "import sys, memctl.cli.fact, memctl.records.facts as f; f.moment('3d', 'as_of'); "
        "f.moment('2026-08-11T03:10:00Z', 'as_of'); "
        f"print(sorted(set({write_path!r}) & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


CONNECTION = re.compile(
    r"(^|_)conn(ection)?$"
)  # conn, read_conn, ...: a parameter that holds a connection


def untyped_connections(name: str, source: str) -> list[str]:
    """The functions of a module (module.qualname) with a connection parameter that has no annotation."""
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = child.args
                if any(
                    CONNECTION.search(a.arg) and a.annotation is None
                    for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]
                ):
                    found.append(f"{name}.{prefix}{child.name}")
                visit(child, f"{prefix}{child.name}.<locals>.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def test_every_connection_parameter_is_typed():
    """A connection parameter says what it is: memctl.db.memory.Memory (what memctl.db.connect makes), or
    psycopg.Connection[Any] for a connection memctl did not open; mypy (pyproject.toml) checks the rest."""
    untyped = {
        f
        for name, path in MODULES.items()
        for f in untyped_connections(name, path.read_text(encoding="utf-8"))
    }
    assert sorted(untyped) == [], "connection parameters without a type"


def test_the_check_sees_an_untyped_connection():
    source = (
        "def f(conn, key: str): ...\ndef g(read_conn: Memory): ...\nclass C:\n    def m(self, *, conn=None):\n"
        "        def inner(admin_conn): ...\n    def n(self, conninfo, connections): ...\n"
    )
    assert untyped_connections("m", source) == ["m.f", "m.C.m", "m.C.m.<locals>.inner"]
