"""memctl systemd: render or install the units of the embedded server and the scheduled jobs (no database)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from memctl.cli.common import settings, warn
from memctl import files
from memctl.errors import MemctlError
from memctl import systemd

app = typer.Typer(
    help="systemd units: memctl-db.service (the embedded server, `memctl db serve`), and timers that run "
    "`memctl embed` every 5 minutes and `memctl backup`, `memctl summarize`, `memctl prune --yes` daily.",
    no_args_is_help=True,
)

BinOption = Annotated[
    Optional[str],
    typer.Option(
        "--bin",
        help="Absolute path of memctl for ExecStart= [default: the running memctl].",
        show_default=False,
    ),
]
UserOption = Annotated[str, typer.Option("--user", help="The system user the jobs run as.")]
EnvFileOption = Annotated[
    str,
    typer.Option(
        "--env-file", help="Optional EnvironmentFile= with MEMCTL_* settings and secrets."
    ),
]
NoEmbeddedOption = Annotated[
    bool,
    typer.Option(
        "--no-embedded",
        help="No memctl-db.service: the jobs use MEMCTL_DATABASE_URL from the env file.",
    ),
]
MetricsOption = Annotated[
    Optional[str],
    typer.Option(
        "--metrics-textfile",
        help="After each job, `memctl metrics --textfile PATH` (a .prom file) "
        "[default: [metrics] textfile; unset: none].",
        show_default=False,
    ),
]


def _extras(no_embedded: bool, metrics_textfile: str | None) -> systemd.Extras:
    config = settings()
    return systemd.Extras(
        embedded=not no_embedded,
        metrics_textfile=metrics_textfile or config.metrics.textfile,
        backup_dir=config.backup.dir,
    )


def _render(
    bin_path: str | None, user: str, env_file: str, extras: systemd.Extras, *, refuse: bool = False
) -> dict[str, str]:
    """The units; what would make them fail here is a warning (render: they may be meant for another machine),
    or with `refuse` (install: they are for this one) a refusal that writes nothing."""
    bin_path = bin_path or systemd.default_bin()
    units = systemd.render_units(bin_path, user, env_file, extras)
    problems = systemd.placement_problems(bin_path, user, extras)
    for problem in problems:
        warn(f"{'refused' if refuse else 'warning'}: {problem}")
    if refuse and problems:
        raise MemctlError(
            f"nothing written: {len(problems)} problem(s) above would make these units fail on this "
            "machine (--force writes them anyway)"
        )
    return units


@app.command()
def render(
    out: Annotated[
        Optional[Path],
        typer.Option(
            "--out",
            help="Write the units into this directory (created if missing) and list them; "
            "without it, print them.",
            show_default=False,
        ),
    ] = None,
    bin_path: BinOption = None,
    user: UserOption = systemd.DEFAULT_USER,
    env_file: EnvFileOption = systemd.DEFAULT_ENV_FILE,
    no_embedded: NoEmbeddedOption = False,
    metrics_textfile: MetricsOption = None,
) -> None:
    """Render the units (memctl-db.service; embed, backup, summarize, prune: a service and a timer each;
    memctl-ingest@.service) and an example of the env file they read and of the config it names
    (memctl.env.example, config.toml.example with --out)."""
    units = _render(bin_path, user, env_file, _extras(no_embedded, metrics_textfile))
    examples = {
        "memctl.env.example": systemd.example_env(),
        "config.toml.example": systemd.example_config(),
    }
    _where(env_file)
    if out is None:
        sys.stdout.write(
            "\n".join(f"# --- {name} ---\n{text}" for name, text in {**units, **examples}.items())
        )
        return
    for path in systemd.write_units(units, out):
        sys.stdout.write(f"{path}\n")
    for name, text in examples.items():
        sys.stdout.write(f"{files.write_text(out / name, text)}\n")


def _where(env_file: str) -> None:
    warn(
        f"the units read {env_file} (example: memctl.env.example), which names their config: "
        f"MEMCTL_CONFIG={systemd.DEFAULT_CONFIG}; a config in ~/.config/memctl never reaches them "
        "(HOME=/var/lib/memctl)"
    )


@app.command()
def install(
    dest: Annotated[
        Path, typer.Option("--dest", help="Directory the units are written to.")
    ] = systemd.DEFAULT_DEST,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Write nothing; say what would be written.")
    ] = False,
    bin_path: BinOption = None,
    user: UserOption = systemd.DEFAULT_USER,
    env_file: EnvFileOption = systemd.DEFAULT_ENV_FILE,
    no_embedded: NoEmbeddedOption = False,
    metrics_textfile: MetricsOption = None,
    state_dir: Annotated[Path, typer.Option("--state-dir", hidden=True)] = Path(systemd.STATE_DIR),
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Write units that would fail here (--user root, a --bin under /home or /tmp, ...).",
        ),
    ] = False,
) -> None:
    """Write the units to /etc/systemd/system and print the commands that enable them.

    Refuses (exit 1, nothing written) units it knows would fail on this machine: --user root (PostgreSQL refuses
    root), a --bin or file under a directory the units hide (/home, /root, /tmp, ...), a --bin that is not an
    executable; --force writes them anyway.

    memctl never runs systemctl, useradd or chown itself: the commands go to stdout. Refuses (exit 1) when
    /var/lib/memctl holds data the units' user does not own (a Quickstart run as root), which systemd would
    chown silently; it prints the commands that keep that data for the units or move it aside.
    """
    extras = _extras(no_embedded, metrics_textfile)
    units = _render(bin_path, user, env_file, extras, refuse=not force)
    foreign = systemd.foreign_data(state_dir, user)
    if foreign:
        owners = ", ".join(f"{path.name or path} ({owner})" for path, owner in foreign[:6])
        for command in systemd.takeover_commands(state_dir, user):
            sys.stdout.write(f"{command}\n")
        raise MemctlError(
            f"{state_dir} holds data {user} does not own: {owners}; systemd would chown it to "
            f"{user} silently when a unit starts. Nothing written: run the commands above first"
        )
    if dry_run:
        for name in units:
            warn(f"would write {dest / name}")
    else:
        for path in systemd.write_units(units, dest, create=False):
            warn(f"wrote {path}")
    if not Path(env_file).exists():
        if dry_run:
            warn(
                f"would write {env_file} and the config it names (examples): {env_file} does not exist"
            )
        else:
            _write_examples(Path(env_file))
    _where(env_file)
    for command in systemd.enable_commands(user, extras.embedded):
        sys.stdout.write(f"{command}\n")


def _write_examples(env_file: Path) -> None:
    """The env file (0600: secrets go there) and, if missing, the config it names (0644: no secrets)."""
    try:
        env_file.parent.mkdir(parents=True, exist_ok=True)
        config = (
            env_file.parent / Path(systemd.DEFAULT_CONFIG).name
        )  # beside it: /etc/memctl/config.toml
        warn(
            f"wrote {files.write_text(env_file, systemd.example_env(str(config)))} (an example: edit it)"
        )
        if not config.exists():
            config.parent.mkdir(parents=True, exist_ok=True)
            warn(
                f"wrote {files.write_text(config, systemd.example_config(), mode=0o644)} (an example: edit it)"
            )
    except OSError as exc:
        warn(
            f"note: could not write the example {env_file} ({exc.strerror}); the jobs use memctl's defaults "
            "until it exists"
        )


def register(app_: typer.Typer) -> None:
    app_.add_typer(app, name="systemd")
