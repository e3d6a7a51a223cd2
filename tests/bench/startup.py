"""Start-up cost: `memctl fact get KEY` (warm server) ÷ a bare psycopg connect + select 1.

Both run as fresh processes against the same server, alternating, N times each;
the ratio of the medians is printed. Goal: at most 1.5.

    python tests/bench/startup.py [--runs 21] [--database-url URL]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from _common import alternate, fresh_database, median, parser, server


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--runs", type=int, default=21)
    args = p.parse_args()
    exe = shutil.which("memctl") or str(Path(sys.executable).parent / "memctl")
    with server(args.database_url) as admin, fresh_database(admin) as url:
        env = {**os.environ, "MEMCTL_DATABASE_URL": url, "MEMCTL_CONFIG": "/dev/null"}
        subprocess.run(
            [exe, "fact", "set", "db.port", "5432"], env=env, check=True, stdout=subprocess.DEVNULL
        )
        bare = [
            sys.executable,
            "-c",
            f"import psycopg; psycopg.connect({url!r}).execute('select 1')",
        ]
        ours = [exe, "fact", "get", "db.port"]
        memctl, base = alternate(ours, bare, env, args.runs, warm=3)
    print(f"bare psycopg connect+select: median {median(base) * 1000:.1f} ms")
    print(f"memctl fact get:             median {median(memctl) * 1000:.1f} ms")
    print(f"ratio (goal <= 1.5): {median(memctl) / median(base):.2f}")


if __name__ == "__main__":
    main()
