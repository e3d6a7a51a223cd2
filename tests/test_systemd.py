"""The systemd units: valid for systemd-analyze, hardened, scheduled as promised; no database needed."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memctl.errors import UsageError
from memctl.upkeep import systemd

# A real executable: systemd-analyze verify refuses an ExecStart= binary that does not exist.
REAL_BIN = str(Path(sys.executable).parent / "memctl") if (Path(sys.executable).parent / "memctl").is_file() \
    else sys.executable
JOBS = {"memctl-embed": "embed", "memctl-summarize": "summarize --skip-if-off", "memctl-prune": "prune --yes"}
MAX_EXPOSURE = 4.0
# The CLI must never open a database: this URL would fail at once if it did.
NO_DB_ENV = {"MEMCTL_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1"}


@pytest.fixture(scope="module")
def analyze():
    """systemd-analyze, or a failure (not a skip): CI installs it, a missing one must be noticed."""
    exe = shutil.which("systemd-analyze")
    if exe is None:
        pytest.fail("systemd-analyze not found: install systemd (apt-get install systemd) to test the units")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([exe, "--no-pager", *args], capture_output=True, text=True, timeout=60,
                              env={"PATH": "/usr/bin:/bin", "TZ": "UTC", "LANG": "C.UTF-8"})

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
    result = analyze("verify", "--man=no", str(unit_dir / f"{job}.service"), str(unit_dir / f"{job}.timer"))
    assert (result.returncode, result.stderr) == (0, "")


@pytest.mark.parametrize("job", JOBS)
def test_security_exposure_at_most_4(analyze, unit_dir, job):
    result = analyze("security", "--offline=yes", str(unit_dir / f"{job}.service"))
    assert result.returncode == 0, result.stderr
    match = re.search(rf"Overall exposure level for {job}\.service: (\d+\.\d+)", result.stdout)
    assert match, result.stdout
    assert float(match.group(1)) <= MAX_EXPOSURE, result.stdout


def test_verify_catches_a_missing_binary(analyze, tmp_path):
    """The verify test can fail: a unit whose ExecStart= does not exist is refused."""
    systemd.write_units(systemd.render_units("/nonexistent/memctl"), tmp_path)
    result = analyze("verify", "--man=no", str(tmp_path / "memctl-embed.service"))
    assert result.returncode != 0 and "/nonexistent/memctl" in result.stderr


def _elapses(analyze, spec: str) -> list[datetime]:
    result = analyze("calendar", "--iterations=3", spec)
    assert result.returncode == 0, result.stderr
    stamps = re.findall(r"(?:Next elapse|Iter\. #\d+): \w+ (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", result.stdout)
    assert len(stamps) == 3, result.stdout
    return [datetime.fromisoformat(stamp) for stamp in stamps]


def test_embed_timer_runs_every_5_minutes(analyze, unit_dir):
    timer = _directives((unit_dir / "memctl-embed.timer").read_text())
    times = _elapses(analyze, _one(timer, "OnCalendar"))
    assert [(b - a).total_seconds() for a, b in zip(times, times[1:])] == [300, 300]
    assert timer["WantedBy"] == ["timers.target"]


@pytest.mark.parametrize("job", ["memctl-summarize", "memctl-prune"])
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
    assert _one(service, "StateDirectory") == "memctl"
    assert _one(service, "SyslogIdentifier") == job
    assert _one(service, "ProtectSystem") == "strict"
    assert _one(service, "NoNewPrivileges") == "yes"
    assert _one(service, "PrivateTmp") == "yes"
    assert service["SystemCallFilter"][0] == "@system-service"
    # The jobs reach PostgreSQL and Ollama: no network cut, the three families allowed.
    assert "PrivateNetwork" not in service and "IPAddressDeny" not in service
    assert set(_one(service, "RestrictAddressFamilies").split()) == {"AF_UNIX", "AF_INET", "AF_INET6"}
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


@pytest.mark.parametrize("job", ["memctl-summarize", "memctl-prune"])
def test_maintenance_is_low_priority(unit_dir, job):
    service = _directives((unit_dir / f"{job}.service").read_text())
    assert int(_one(service, "Nice")) > 0
    assert _one(service, "IOSchedulingClass") == "idle"


def test_render_fills_every_placeholder():
    units = systemd.render_units("/opt/memctl/bin/memctl", "agentmem", "/srv/memctl.env")
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


@pytest.mark.parametrize("bin_path,user,env_file", [
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
])
def test_bad_values_are_refused(bin_path, user, env_file):
    with pytest.raises(UsageError):
        systemd.render_units(bin_path, user, env_file)


def test_good_unusual_values_are_accepted():
    units = systemd.render_units("/opt/memctl-1.2_x+y/bin/memctl", "_memctl-2", "/etc/memctl/memctl.env")
    assert "User=_memctl-2\n" in units["memctl-prune.service"]


def test_write_units_writes_each_file(tmp_path):
    units = systemd.render_units(REAL_BIN)
    paths = systemd.write_units(units, tmp_path / "new" / "dir")
    assert [p.name for p in paths] == list(units)
    assert all(p.read_text() == units[p.name] and (p.stat().st_mode & 0o777) == 0o644 for p in paths)
    assert sorted(p.name for p in (tmp_path / "new" / "dir").iterdir()) == sorted(units)


def test_templates_dir_holds_every_unit():
    assert sorted(p.name for p in systemd.templates_dir().iterdir()) == sorted(systemd.UNIT_NAMES)


def test_enable_commands_hint_useradd_only_for_a_missing_user():
    assert systemd.enable_commands("root") == [
        "systemctl daemon-reload",
        "systemctl enable --now memctl-embed.timer memctl-summarize.timer memctl-prune.timer",
    ]
    commands = systemd.enable_commands("memctl-no-such-user")
    assert commands[0].startswith("useradd --system ") and commands[0].endswith(" memctl-no-such-user")
    assert "--home-dir /var/lib/memctl" in commands[0]
    assert commands[1:] == systemd.enable_commands("root")


# ---------------------------------------------------------------- CLI


def _invoke(*args: str):
    from memctl.cli import app

    return CliRunner().invoke(app, list(args), env=NO_DB_ENV, catch_exceptions=False)


def test_cli_render_out_lists_the_files(tmp_path):
    result = _invoke("systemd", "render", "--out", str(tmp_path), "--bin", REAL_BIN, "--user", "agentmem")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == [str(tmp_path / name) for name in systemd.UNIT_NAMES]
    assert "User=agentmem\n" in (tmp_path / "memctl-embed.service").read_text()


def test_cli_render_prints_units_with_headers():
    result = _invoke("systemd", "render", "--bin", "/opt/memctl/bin/memctl")
    assert result.exit_code == 0, result.stderr
    headers = re.findall(r"^# --- (\S+) ---$", result.stdout, re.M)
    assert headers == list(systemd.UNIT_NAMES)
    assert "ExecStart=/opt/memctl/bin/memctl prune --yes\n" in result.stdout
    assert "not an executable file" in result.stderr


def test_cli_install_dry_run_writes_nothing_and_prints_the_commands(tmp_path):
    result = _invoke("systemd", "install", "--dest", str(tmp_path), "--dry-run", "--bin", REAL_BIN,
                     "--user", "memctl-no-such-user")
    assert result.exit_code == 0, result.stderr
    assert list(tmp_path.iterdir()) == []
    lines = result.stdout.splitlines()
    assert lines[0].startswith("useradd --system ")
    assert lines[1:] == ["systemctl daemon-reload",
                         "systemctl enable --now memctl-embed.timer memctl-summarize.timer memctl-prune.timer"]
    assert str(tmp_path / "memctl-embed.service") in result.stderr


def test_cli_install_writes_the_units(tmp_path):
    env_file = tmp_path / "memctl.env"
    env_file.write_text("MEMCTL_EMBEDDER=hash\n")
    dest = tmp_path / "system"
    dest.mkdir()
    result = _invoke("systemd", "install", "--dest", str(dest), "--bin", REAL_BIN, "--user", "root",
                     "--env-file", str(env_file))
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in dest.iterdir()) == sorted(systemd.UNIT_NAMES)
    assert f"EnvironmentFile=-{env_file}\n" in (dest / "memctl-prune.service").read_text()
    assert result.stdout.splitlines() == systemd.enable_commands("root")


@pytest.mark.parametrize("make_dest", [lambda p: p / "missing", lambda p: (p / "file").touch() or p / "file"])
def test_cli_install_refuses_a_destination_it_cannot_write(tmp_path, make_dest):
    dest = make_dest(tmp_path)
    result = _invoke("systemd", "install", "--dest", str(dest), "--bin", REAL_BIN)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert f"cannot write units to {dest}" in result.stderr


def test_cli_refuses_a_relative_bin():
    result = _invoke("systemd", "render", "--bin", "memctl")
    assert result.exit_code == 2
    assert "absolute path" in result.stderr and result.stdout == ""
