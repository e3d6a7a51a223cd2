"""The systemd units: valid for systemd-analyze, hardened, scheduled as promised; no database needed."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memctl.errors import UsageError
from memctl import systemd

# A real executable: systemd-analyze verify refuses an ExecStart= binary that does not exist.
REAL_BIN = (
    str(Path(sys.executable).parent / "memctl")
    if (Path(sys.executable).parent / "memctl").is_file()
    else sys.executable
)
# The same, where the units can see it: a checkout under /tmp or /home (CI's, a developer's) is refused by
# `install` unless forced, so the tests of install's other refusals name the interpreter's real path.
PLACED_BIN = next(
    path
    for path in (REAL_BIN, str(Path(sys.executable).resolve()), "/usr/bin/env")
    if not any(
        "the units hide" in problem for problem in systemd.placement_problems(path, "memctl")
    )
)
JOBS = {
    "memctl-embed": "embed",
    "memctl-summarize": "summarize --skip-if-off",
    "memctl-prune": "prune --yes",
    "memctl-backup": "backup",
}
SERVICES = ["memctl-db", *JOBS, "memctl-mcp"]
MAX_EXPOSURE = 4.0
# The CLI must never open a database: this URL would fail at once if it did. No config file of the runner's.
NO_DB_ENV = {
    "MEMCTL_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1",
    "MEMCTL_CONFIG": os.devnull,
}
TEXTFILE = "/var/lib/prometheus/node-exporter/memctl.prom"


@pytest.fixture(scope="module")
def analyze():
    """systemd-analyze, or a failure (not a skip): CI installs it, a missing one must be noticed."""
    exe = shutil.which("systemd-analyze")
    if exe is None:
        pytest.fail(
            "systemd-analyze not found: install systemd (apt-get install systemd) to test the units"
        )

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [exe, "--no-pager", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": "/usr/bin:/bin", "TZ": "UTC", "LANG": "C.UTF-8"},
        )

    return run


@pytest.fixture
def unit_dir(tmp_path) -> Path:
    systemd.write_units(systemd.render_units(REAL_BIN), tmp_path)
    return tmp_path


def _directives(text: str) -> dict[str, list[str]]:
    """Key -> values of a unit file, comments and section headers skipped."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            found.setdefault(key, []).append(value)
    return found


def _one(directives: dict[str, list[str]], key: str) -> str:
    assert len(directives.get(key, [])) == 1, f"{key}= set {len(directives.get(key, []))} times"
    return directives[key][0]


# ---------------------------------------------------------------- systemd-analyze


@pytest.mark.parametrize("job", JOBS)
def test_verify_is_clean(analyze, unit_dir, job):
    result = analyze(
        "verify", "--man=no", str(unit_dir / f"{job}.service"), str(unit_dir / f"{job}.timer")
    )
    assert (result.returncode, result.stderr) == (0, "")


@pytest.mark.parametrize(
    "extras",
    [
        systemd.Extras(),
        systemd.Extras(embedded=False, metrics_textfile=TEXTFILE, backup_dir="/srv/memctl-backups"),
    ],
)
def test_verify_is_clean_for_every_rendered_unit_together(analyze, tmp_path, extras):
    paths = systemd.write_units(systemd.render_units(REAL_BIN, extras=extras), tmp_path)
    assert len(paths) == len(systemd.unit_names(extras.embedded))
    result = analyze("verify", "--man=no", *map(str, paths))
    assert (result.returncode, result.stderr) == (0, "")


@pytest.mark.parametrize("job", SERVICES)
def test_security_exposure_at_most_4(analyze, unit_dir, job):
    result = analyze("security", "--offline=yes", str(unit_dir / f"{job}.service"))
    assert result.returncode == 0, result.stderr
    match = re.search(rf"Overall exposure level for {job}\.service: (\d+\.\d+)", result.stdout)
    assert match, result.stdout
    assert float(match.group(1)) <= MAX_EXPOSURE, result.stdout


def test_the_mcp_unit_serves_http_on_loopback_after_the_database(unit_dir):
    service = _directives((unit_dir / "memctl-mcp.service").read_text())
    assert _one(service, "ExecStart") == f"{REAL_BIN} mcp --http ${{MEMCTL_MCP_ADDRESS}}"
    assert "MEMCTL_MCP_ADDRESS=127.0.0.1:8765" in service["Environment"]
    assert service["Requires"] == ["memctl-db.service"] and "memctl-db.service" in service["After"]
    assert "Requires" not in _directives(
        systemd.render_units(REAL_BIN, extras=systemd.Extras(embedded=False))["memctl-mcp.service"]
    )


def test_verify_catches_a_missing_binary(analyze, tmp_path):
    """The verify test can fail: a unit whose ExecStart= does not exist is refused."""
    systemd.write_units(systemd.render_units("/nonexistent/memctl"), tmp_path)
    result = analyze("verify", "--man=no", str(tmp_path / "memctl-embed.service"))
    assert result.returncode != 0 and "/nonexistent/memctl" in result.stderr


def _elapses(analyze, spec: str) -> list[datetime]:
    result = analyze("calendar", "--iterations=3", spec)
    assert result.returncode == 0, result.stderr
    stamps = re.findall(
        r"(?:Next elapse|Iter\. #\d+): \w+ (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", result.stdout
    )
    assert len(stamps) == 3, result.stdout
    return [datetime.fromisoformat(stamp) for stamp in stamps]


def test_embed_timer_runs_every_5_minutes(analyze, unit_dir):
    timer = _directives((unit_dir / "memctl-embed.timer").read_text())
    times = _elapses(analyze, _one(timer, "OnCalendar"))
    assert [(b - a).total_seconds() for a, b in zip(times, times[1:])] == [300, 300]
    assert timer["WantedBy"] == ["timers.target"]


@pytest.mark.parametrize("job", ["memctl-summarize", "memctl-prune", "memctl-backup"])
def test_daily_timers_are_daily_persistent_and_randomized(analyze, unit_dir, job):
    timer = _directives((unit_dir / f"{job}.timer").read_text())
    times = _elapses(analyze, _one(timer, "OnCalendar"))
    assert [(b - a).total_seconds() for a, b in zip(times, times[1:])] == [86400, 86400]
    assert _one(timer, "Persistent") == "true"
    assert re.fullmatch(r"[1-9]\d*(s|min|h)", _one(timer, "RandomizedDelaySec"))
    assert timer["WantedBy"] == ["timers.target"]


# ---------------------------------------------------------------- rendered content


@pytest.mark.parametrize("job,args", JOBS.items())
def test_service_runs_the_job_as_the_user_with_network_and_one_state_dir(unit_dir, job, args):
    service = _directives((unit_dir / f"{job}.service").read_text())
    assert _one(service, "ExecStart") == f"{REAL_BIN} {args}"
    assert _one(service, "Type") == "oneshot"
    assert re.fullmatch(r"\d+(min|h)", _one(service, "TimeoutStartSec"))
    assert _one(service, "User") == "memctl"
    assert _one(service, "EnvironmentFile") == "-/etc/memctl/memctl.env"
    assert "MEMCTL_HOME=/var/lib/memctl" in service["Environment"]
    assert _one(service, "StateDirectory").split()[0] == "memctl"
    assert (
        _one(service, "StateDirectoryMode") == "0750"
    )  # the same as memctl-db.service's: one mode per directory
    # The server is memctl-db.service's: started before the job, never by it.
    assert "memctl-db.service" in service["Wants"] and "memctl-db.service" in service["After"]
    assert "ExecStopPost" not in service  # no metrics textfile unless one is given
    assert _one(service, "SyslogIdentifier") == job
    assert _one(service, "ProtectSystem") == "strict"
    assert _one(service, "NoNewPrivileges") == "yes"
    assert _one(service, "PrivateTmp") == "yes"
    assert service["SystemCallFilter"][0] == "@system-service"
    # The jobs reach PostgreSQL and Ollama: no network cut, the three families allowed.
    assert "PrivateNetwork" not in service and "IPAddressDeny" not in service
    assert set(_one(service, "RestrictAddressFamilies").split()) == {
        "AF_UNIX",
        "AF_INET",
        "AF_INET6",
    }
    assert not (set(service.get("ReadWritePaths", [])) | set(service.get("BindPaths", [])))


def _seconds(span: str) -> int:
    number, unit = re.fullmatch(r"(\d+)(s|min|h)", span).groups()
    return int(number) * {"s": 1, "min": 60, "h": 3600}[unit]


def test_summarize_runs_before_prune(analyze, unit_dir):
    """The latest summarize start (its calendar time plus the random delay) comes before the earliest prune;
    if both are started together (Persistent= catching up at boot), Before= makes prune wait."""
    summarize = _directives((unit_dir / "memctl-summarize.timer").read_text())
    prune = _directives((unit_dir / "memctl-prune.timer").read_text())
    start = _elapses(analyze, _one(summarize, "OnCalendar"))[0]
    next_prune = min(t for t in _elapses(analyze, _one(prune, "OnCalendar")) if t > start)
    latest = start.timestamp() + _seconds(_one(summarize, "RandomizedDelaySec"))
    assert latest <= next_prune.timestamp() and (next_prune - start).total_seconds() < 86400
    service = _directives((unit_dir / "memctl-summarize.service").read_text())
    assert _one(service, "Before") == "memctl-prune.service"


def test_backup_runs_before_summarize_and_keeps_its_backups_in_the_state_dir(analyze, unit_dir):
    backup = _directives((unit_dir / "memctl-backup.timer").read_text())
    summarize = _directives((unit_dir / "memctl-summarize.timer").read_text())
    start = _elapses(analyze, _one(backup, "OnCalendar"))[0]
    next_summarize = min(t for t in _elapses(analyze, _one(summarize, "OnCalendar")) if t > start)
    assert (
        start.timestamp() + _seconds(_one(backup, "RandomizedDelaySec"))
        <= next_summarize.timestamp()
    )
    service = _directives((unit_dir / "memctl-backup.service").read_text())
    assert _one(service, "Before").split() == ["memctl-summarize.service", "memctl-prune.service"]
    assert _one(service, "StateDirectory").split() == ["memctl", "memctl/backups"]


@pytest.mark.parametrize("job", ["memctl-summarize", "memctl-prune", "memctl-backup"])
def test_maintenance_is_low_priority(unit_dir, job):
    service = _directives((unit_dir / f"{job}.service").read_text())
    assert int(_one(service, "Nice")) > 0
    assert _one(service, "IOSchedulingClass") == "idle"


def test_render_fills_every_placeholder():
    units = systemd.render_units(
        "/opt/memctl/bin/memctl",
        "agentmem",
        "/srv/memctl.env",
        systemd.Extras(metrics_textfile=TEXTFILE, backup_dir="/srv/backups"),
    )
    assert list(units) == list(systemd.UNIT_NAMES)
    for text in units.values():
        assert not re.search(r"@[A-Z_]+@", text)
    for job, args in JOBS.items():
        service = _directives(units[f"{job}.service"])
        assert _one(service, "ExecStart") == f"/opt/memctl/bin/memctl {args}"
        assert _one(service, "User") == "agentmem"
        assert _one(service, "EnvironmentFile") == "-/srv/memctl.env"


def test_values_are_not_expanded_twice():
    """A value that looks like a placeholder is written as given, not substituted again."""
    units = systemd.render_units("/opt/@USER@/memctl", "memctl")
    assert "ExecStart=/opt/@USER@/memctl embed" in units["memctl-embed.service"]


@pytest.mark.parametrize(
    "bin_path,user,env_file",
    [
        ("memctl", "memctl", "/etc/memctl/memctl.env"),
        ("bin/memctl", "memctl", "/etc/memctl/memctl.env"),
        ("/usr/bin/memctl\nExecStartPre=/bin/sh", "memctl", "/etc/memctl/memctl.env"),
        ("/opt/my memctl/memctl", "memctl", "/etc/memctl/memctl.env"),
        ("/opt/%h/memctl", "memctl", "/etc/memctl/memctl.env"),
        ("/opt/$HOME/memctl", "memctl", "/etc/memctl/memctl.env"),
        ("/opt/memctl;rm", "memctl", "/etc/memctl/memctl.env"),
        ("/opt/../usr/bin/memctl", "memctl", "/etc/memctl/memctl.env"),
        ("/usr/bin/memctl", "root\nExecStartPre=/bin/sh", "/etc/memctl/memctl.env"),
        ("/usr/bin/memctl", "bad user", "/etc/memctl/memctl.env"),
        ("/usr/bin/memctl", "1memctl", "/etc/memctl/memctl.env"),
        ("/usr/bin/memctl", "-memctl", "/etc/memctl/memctl.env"),
        ("/usr/bin/memctl", "m.ctl", "/etc/memctl/memctl.env"),
        ("/usr/bin/memctl", "m" * 32, "/etc/memctl/memctl.env"),
        ("/usr/bin/memctl", "", "/etc/memctl/memctl.env"),
        ("/usr/bin/memctl", "memctl", "memctl.env"),
        ("/usr/bin/memctl", "memctl", "/etc/memctl/memctl.env\nUser=root"),
        ("/usr/bin/memctl", "memctl", "/etc/memctl/my env"),
    ],
)
def test_bad_values_are_refused(bin_path, user, env_file):
    with pytest.raises(UsageError):
        systemd.render_units(bin_path, user, env_file)


def test_good_unusual_values_are_accepted():
    units = systemd.render_units(
        "/opt/memctl-1.2_x+y/bin/memctl", "_memctl-2", "/etc/memctl/memctl.env"
    )
    assert "User=_memctl-2\n" in units["memctl-prune.service"]


def test_write_units_writes_each_file(tmp_path):
    units = systemd.render_units(REAL_BIN)
    paths = systemd.write_units(units, tmp_path / "new" / "dir")
    assert [p.name for p in paths] == list(units)
    assert all(
        p.read_text() == units[p.name] and (p.stat().st_mode & 0o777) == 0o644 for p in paths
    )
    assert sorted(p.name for p in (tmp_path / "new" / "dir").iterdir()) == sorted(units)


def test_templates_dir_holds_every_unit():
    assert sorted(p.name for p in systemd.templates_dir().iterdir()) == sorted(systemd.UNIT_NAMES)


TIMERS_LINE = (
    "systemctl enable --now memctl-embed.timer memctl-summarize.timer memctl-prune.timer "
    "memctl-backup.timer"
)


def test_enable_commands_hint_useradd_only_for_a_missing_user():
    assert systemd.enable_commands("root") == [
        "systemctl daemon-reload",
        "systemctl enable --now memctl-db.service",
        TIMERS_LINE,
    ]
    assert systemd.enable_commands("root", embedded=False) == [
        "systemctl daemon-reload",
        TIMERS_LINE,
    ]
    commands = systemd.enable_commands("memctl-no-such-user")
    assert commands[0].startswith("useradd --system ") and commands[0].endswith(
        " memctl-no-such-user"
    )
    assert "--home-dir /var/lib/memctl" in commands[0]
    assert commands[1:] == systemd.enable_commands("root")


# ---------------------------------------------------------------- CLI


def _invoke(*args: str):
    from memctl.cli import app

    return CliRunner().invoke(app, list(args), env=NO_DB_ENV, catch_exceptions=False)


def test_cli_render_out_lists_the_files(tmp_path):
    result = _invoke(
        "systemd", "render", "--out", str(tmp_path), "--bin", REAL_BIN, "--user", "agentmem"
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == [str(tmp_path / name) for name in systemd.UNIT_NAMES] + [
        str(tmp_path / "memctl.env.example"),
        str(tmp_path / "config.toml.example"),
    ]
    assert "User=agentmem\n" in (tmp_path / "memctl-embed.service").read_text()
    # where the timers' config lives: named in the env file, said on stderr
    assert (
        "MEMCTL_CONFIG=/etc/memctl/config.toml\n" in (tmp_path / "memctl.env.example").read_text()
    )
    assert "MEMCTL_CONFIG=/etc/memctl/config.toml" in result.stderr and "~/.config" in result.stderr


def test_cli_render_prints_units_with_headers():
    result = _invoke("systemd", "render", "--bin", "/opt/memctl/bin/memctl")
    assert result.exit_code == 0, result.stderr
    headers = re.findall(r"^# --- (\S+) ---$", result.stdout, re.M)
    assert headers == [*systemd.UNIT_NAMES, "memctl.env.example", "config.toml.example"]
    assert "ExecStart=/opt/memctl/bin/memctl prune --yes\n" in result.stdout
    assert "not an executable file" in result.stderr


def test_cli_install_dry_run_writes_nothing_and_prints_the_commands(tmp_path):
    result = _invoke(
        "systemd",
        "install",
        "--dest",
        str(tmp_path),
        "--dry-run",
        "--bin",
        PLACED_BIN,
        "--user",
        "memctl-no-such-user",
        "--state-dir",
        str(tmp_path / "no-state-yet"),
    )
    assert result.exit_code == 0, result.stderr
    assert list(tmp_path.iterdir()) == []
    lines = result.stdout.splitlines()
    assert lines[0].startswith("useradd --system ")
    assert lines[1:] == [
        "systemctl daemon-reload",
        "systemctl enable --now memctl-db.service",
        TIMERS_LINE,
    ]
    assert str(tmp_path / "memctl-embed.service") in result.stderr


def test_cli_install_writes_the_units(tmp_path):
    env_file = tmp_path / "memctl.env"
    env_file.write_text("MEMCTL_EMBEDDER=hash\n")
    dest = tmp_path / "system"
    dest.mkdir()
    result = _invoke(
        "systemd",
        "install",
        "--dest",
        str(dest),
        "--bin",
        REAL_BIN,
        "--user",
        "root",
        "--env-file",
        str(env_file),
        "--state-dir",
        str(tmp_path / "no-state-yet"),
        "--force",
    )
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in dest.iterdir()) == sorted(systemd.UNIT_NAMES)
    assert f"EnvironmentFile=-{env_file}\n" in (dest / "memctl-prune.service").read_text()
    assert result.stdout.splitlines() == systemd.enable_commands("root")


@pytest.mark.parametrize(
    "make_dest", [lambda p: p / "missing", lambda p: (p / "file").touch() or p / "file"]
)
def test_cli_install_refuses_a_destination_it_cannot_write(tmp_path, make_dest):
    dest = make_dest(tmp_path)
    result = _invoke(
        "systemd",
        "install",
        "--dest",
        str(dest),
        "--bin",
        PLACED_BIN,
        "--state-dir",
        str(tmp_path / "no-state-yet"),
    )
    assert result.exit_code == 1
    assert result.stdout == ""
    assert f"cannot write units to {dest}" in result.stderr


def test_cli_refuses_a_relative_bin():
    result = _invoke("systemd", "render", "--bin", "memctl")
    assert result.exit_code == 2
    assert "absolute path" in result.stderr and result.stdout == ""


# ---------------------------------------------------------------- memctl-db.service, choices at render time


def test_db_service_runs_the_server_in_the_foreground_as_the_user(unit_dir):
    service = _directives((unit_dir / "memctl-db.service").read_text())
    assert _one(service, "ExecStart") == f"{REAL_BIN} db serve --socket-dir /run/memctl-db"
    assert _one(service, "Type") == "notify"  # ready only once the server and its database are
    # SIGINT to `memctl db serve` alone, which asks postgres for its fast (clean) shutdown.
    assert (_one(service, "KillMode"), _one(service, "KillSignal")) == ("mixed", "SIGINT")
    assert (
        _one(service, "User") == "memctl" and "Group" not in service
    )  # the socket's group is the user's
    assert (
        _one(service, "Restart") == "on-failure"
        and _one(service, "RestartPreventExitStatus") == "1 2"
    )
    assert "MEMCTL_HOME=/var/lib/memctl" in service["Environment"]
    assert (_one(service, "StateDirectory"), _one(service, "StateDirectoryMode")) == (
        "memctl",
        "0750",
    )
    # Its own runtime directory: the jobs' /run/memctl is removed whenever a job ends.
    assert (_one(service, "RuntimeDirectory"), _one(service, "RuntimeDirectoryMode")) == (
        "memctl-db",
        "0750",
    )
    assert (
        _one(service, "PrivateNetwork") == "yes"
        and _one(service, "RestrictAddressFamilies") == "AF_UNIX"
    )
    assert service["WantedBy"] == ["multi-user.target"]


def test_no_embedded_leaves_out_the_server_and_the_jobs_dependency():
    units = systemd.render_units(REAL_BIN, extras=systemd.Extras(embedded=False))
    assert list(units) == [name for name in systemd.UNIT_NAMES if name != "memctl-db.service"]
    assert not any(
        "Wants=memctl-db.service" in text or "After=memctl-db.service" in text
        for text in units.values()
    )


def test_metrics_textfile_adds_a_refresh_after_every_job():
    units = systemd.render_units(
        "/opt/memctl/bin/memctl", extras=systemd.Extras(metrics_textfile=TEXTFILE)
    )
    for job in JOBS:
        service = _directives(units[f"{job}.service"])
        assert (
            _one(service, "ExecStopPost")
            == f"-/opt/memctl/bin/memctl metrics --textfile {TEXTFILE}"
        )
        assert _one(service, "ReadWritePaths") == "-/var/lib/prometheus/node-exporter"
    db = _directives(units["memctl-db.service"])
    assert "ExecStopPost" not in db and "ReadWritePaths" not in db


def test_backup_dir_outside_the_state_dir_is_made_writable_for_the_backup_only():
    units = systemd.render_units(REAL_BIN, extras=systemd.Extras(backup_dir="/srv/memctl-backups"))
    assert (
        _one(_directives(units["memctl-backup.service"]), "ReadWritePaths")
        == "-/srv/memctl-backups"
    )
    others = [job for job in JOBS if job != "memctl-backup"]
    assert all("ReadWritePaths" not in _directives(units[f"{job}.service"]) for job in others)
    inside = systemd.render_units(
        REAL_BIN, extras=systemd.Extras(backup_dir="/var/lib/memctl/dumps")
    )
    assert "ReadWritePaths" not in _directives(inside["memctl-backup.service"])


@pytest.mark.parametrize(
    "extras",
    [
        systemd.Extras(metrics_textfile="memctl.prom"),
        systemd.Extras(metrics_textfile="/var/lib/node/memctl.txt"),
        systemd.Extras(metrics_textfile="/memctl.prom"),
        systemd.Extras(metrics_textfile="/etc/memctl.prom"),
        systemd.Extras(metrics_textfile="/var/lib/node/memctl.prom\nExecStartPre=/bin/sh"),
        systemd.Extras(metrics_textfile="/var/lib/%h/memctl.prom"),
        systemd.Extras(metrics_textfile="/var/lib/node/../memctl.prom"),
        systemd.Extras(backup_dir="/srv"),
        systemd.Extras(backup_dir="~/backups"),
        systemd.Extras(backup_dir="/srv/my backups"),
    ],
)
def test_bad_choices_are_refused(extras):
    with pytest.raises(UsageError):
        systemd.render_units(REAL_BIN, extras=extras)


def test_cli_takes_the_metrics_textfile_from_the_settings_and_the_option(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(f'[metrics]\ntextfile = "{TEXTFILE}"\n')
    from memctl.cli import app

    result = CliRunner().invoke(
        app,
        ["systemd", "render", "--out", str(tmp_path / "a"), "--bin", REAL_BIN],
        env={**NO_DB_ENV, "MEMCTL_CONFIG": str(config)},
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.stderr
    assert (
        f"metrics --textfile {TEXTFILE}\n" in (tmp_path / "a" / "memctl-prune.service").read_text()
    )
    other = "/var/lib/node-exporter/other.prom"
    result = _invoke(
        "systemd",
        "render",
        "--out",
        str(tmp_path / "b"),
        "--bin",
        REAL_BIN,
        "--metrics-textfile",
        other,
    )
    assert result.exit_code == 0, result.stderr
    assert f"metrics --textfile {other}\n" in (tmp_path / "b" / "memctl-embed.service").read_text()
    result = _invoke(
        "systemd", "render", "--out", str(tmp_path / "c"), "--bin", REAL_BIN, "--no-embedded"
    )
    assert result.exit_code == 0, result.stderr
    assert "ExecStopPost" not in (tmp_path / "c" / "memctl-embed.service").read_text()
    assert not (tmp_path / "c" / "memctl-db.service").exists()


# ---------------------------------------------------------------- a root Quickstart's data


def _me() -> str:
    return pwd.getpwuid(os.geteuid()).pw_name


def test_an_absent_or_empty_state_dir_or_one_the_user_owns_is_fine(tmp_path):
    assert systemd.foreign_data(tmp_path / "absent", _me()) == []
    assert systemd.foreign_data(tmp_path, _me()) == []  # empty
    (tmp_path / "pgdata").mkdir()
    assert systemd.foreign_data(tmp_path, _me()) == []
    assert [p for p, _ in systemd.foreign_data(tmp_path, "memctl-no-such-user")] == [
        tmp_path,
        tmp_path / "pgdata",
    ]


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_install_refuses_a_database_another_user_owns_and_says_what_to_run(tmp_path):
    """A Quickstart run as root leaves pgdata to embedded_postgres: systemd would chown it silently."""
    state = tmp_path / "state"
    (state / "pgdata").mkdir(parents=True)
    os.chown(state / "pgdata", 1234567, 1234567)  # an owner that is not the units' user
    dest = tmp_path / "system"
    dest.mkdir()
    result = _invoke(
        "systemd",
        "install",
        "--dest",
        str(dest),
        "--bin",
        REAL_BIN,
        "--user",
        _me(),
        "--env-file",
        str(tmp_path / "memctl.env"),
        "--state-dir",
        str(state),
        "--force",
    )  # --user may be root here
    assert result.exit_code == 1
    assert list(dest.iterdir()) == []  # nothing written
    assert (state / "pgdata").stat().st_uid == 1234567  # nothing chowned
    assert "pgdata (1234567)" in result.stderr and "silently" in result.stderr
    commands = [line for line in result.stdout.splitlines() if not line.startswith("#")]
    assert commands == [
        f"MEMCTL_HOME={state} memctl db stop",
        f"chown -R {_me()}:{_me()} {state}",
        f"MEMCTL_HOME={state} memctl db stop",
        f"mv {state} {state}.before-units",
    ]
    dry = _invoke(
        "systemd",
        "install",
        "--dest",
        str(dest),
        "--dry-run",
        "--bin",
        REAL_BIN,
        "--user",
        _me(),
        "--env-file",
        str(tmp_path / "memctl.env"),
        "--state-dir",
        str(state),
        "--force",
    )  # --user may be root here
    assert dry.exit_code == 1 and dry.stdout == result.stdout

    os.chown(state / "pgdata", os.geteuid(), os.getegid())  # what the printed chown does
    done = _invoke(
        "systemd",
        "install",
        "--dest",
        str(dest),
        "--bin",
        REAL_BIN,
        "--user",
        _me(),
        "--env-file",
        str(tmp_path / "memctl.env"),
        "--state-dir",
        str(state),
        "--force",
    )  # --user may be root here
    assert done.exit_code == 0, done.stderr
    assert sorted(p.name for p in dest.iterdir()) == sorted(systemd.UNIT_NAMES)


def test_the_ingest_template_follows_a_units_journal_hardened(analyze, unit_dir):
    """memctl-ingest@.service: an instance verifies clean, exposure <= 4, and runs ingest with its cursor."""
    instance = unit_dir / "memctl-ingest@nginx.service"
    instance.write_text((unit_dir / systemd.INGEST_SERVICE).read_text())
    result = analyze("verify", "--man=no", str(instance))
    assert (result.returncode, result.stderr) == (0, "")
    result = analyze("security", "--offline=yes", str(instance))
    match = re.search(
        r"Overall exposure level for memctl-ingest@nginx\.service: (\d+\.\d+)", result.stdout
    )
    assert match and float(match.group(1)) <= MAX_EXPOSURE, result.stdout
    directives = _directives(instance.read_text())
    assert _one(directives, "ExecStart") == (
        f"{REAL_BIN} ingest --journal-unit %i --source %i "
        "--cursor-file /var/lib/memctl/ingest/%i.cursor"
    )
    assert _one(directives, "SupplementaryGroups") == "systemd-journal"


@pytest.mark.parametrize(
    "args,reason",
    [
        (["--user", "root"], "PostgreSQL refuses root"),
        (["--bin", "/tmp/venv/bin/memctl"], "under /tmp"),
        (["--bin", "/home/alice/.venv/bin/memctl"], "under /home"),
    ],
)
def test_cli_install_refuses_units_it_knows_would_fail_unless_forced(tmp_path, args, reason):
    dest = tmp_path / "system"
    dest.mkdir()
    base = [
        "systemd",
        "install",
        "--dest",
        str(dest),
        "--state-dir",
        str(tmp_path / "no-state-yet"),
        "--env-file",
        str(tmp_path / "etc" / "memctl.env"),
    ]
    full = [*base, *(["--bin", REAL_BIN] if "--bin" not in args else []), *args]
    result = _invoke(*full)
    assert result.exit_code == 1 and reason in result.stderr and "--force" in result.stderr
    assert list(dest.iterdir()) == [] and result.stdout == ""
    assert _invoke(*full, "--force").exit_code == 0
    assert list(dest.iterdir())
    # the env file did not exist: an example was written, naming the config written beside it
    assert (
        f"MEMCTL_CONFIG={tmp_path / 'etc' / 'config.toml'}"
        in (tmp_path / "etc" / "memctl.env").read_text()
    )
    assert (tmp_path / "etc" / "memctl.env").stat().st_mode & 0o777 == 0o600
    assert "[retention]" in (tmp_path / "etc" / "config.toml").read_text()


# The exits that end a service and those that restart it (docs/systemd.md, "Exit codes"): a stop (130, 143)
# is clean in every unit; the long-running ones restart on a failure that may pass (1, 3, 5), never on bad
# input or options (2), which would fail the same way again.
@pytest.mark.parametrize(
    "name", [*JOBS, "memctl-mcp", systemd.INGEST_SERVICE.removesuffix(".service")]
)
def test_a_stop_is_clean_and_only_a_failure_that_may_pass_restarts(unit_dir, name):
    directives = _directives((unit_dir / f"{name}.service").read_text())
    stops = {"130", "143"}
    if name in JOBS:
        assert set(_one(directives, "SuccessExitStatus").split()) == stops
        assert "Restart" not in directives  # a timer's job: the next run is the retry
        return
    # 75: a newer memctl migrated the memory under the service, which stopped cleanly: started again at once
    assert set(_one(directives, "SuccessExitStatus").split()) == stops | {"75"}
    assert _one(directives, "RestartForceExitStatus").split() == ["75"]
    assert _one(directives, "Restart") == "on-failure"
    assert _one(directives, "RestartPreventExitStatus").split() == ["2"]
