"""The retention policy: each episode kind's maximum age, what is kept whatever its age, the job log's age.

Read from [retention] (or from another file's, `prune --policy FILE`) by prune, and by summarize, whose
kinds prune keeps until a summary holds them.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memctl.errors import ConfigError

KEEP_IMPORTANCE = "keep_importance"
JOBS = "jobs"  # [retention] jobs: the job log's maximum age, not an episode kind
REQUIRE_SUMMARY = (
    "require_summary"  # [retention] require_summary: prune waits for summaries (not a kind)
)


@dataclass
class Policy:
    """Maximum age per kind (durations like '30d'); kinds not named are kept.

    keep_importance: episodes of importance >= N are kept whatever their age (all kinds).
    jobs: the maximum age of the job log (jobs and runbook_runs rows), 90d unless set.
    require_summary: with [summarize] model set, episodes of summarized kinds that no summary
    holds yet are kept (the caller names those kinds: see memctl.retention.summarize.awaited_kinds).
    """

    max_age: dict[str, str]
    keep_importance: int | None = None
    jobs: str = field(default_factory=lambda: _default_job_age())
    require_summary: bool = True

    @classmethod
    def from_section(cls, section: dict[str, Any]) -> Policy:
        section = dict(section)
        keep = section.pop(KEEP_IMPORTANCE, None)
        jobs = section.pop(JOBS, None) or _default_job_age()
        require_summary = section.pop(REQUIRE_SUMMARY, True)
        return cls(dict(sorted(section.items())), keep, jobs, require_summary)

    @property
    def empty(self) -> bool:
        """No episode kind named: prune deletes no episode (the job log is trimmed all the same)."""
        return not self.max_age

    def cutoffs(self, now: datetime.datetime) -> dict[str, datetime.datetime]:
        from memctl.config import parse_duration

        return {
            kind: now - datetime.timedelta(seconds=parse_duration(age))
            for kind, age in self.max_age.items()
        }

    def job_log_cutoff(self, now: datetime.datetime) -> datetime.datetime:
        from memctl.config import parse_duration

        return now - datetime.timedelta(seconds=parse_duration(self.jobs))


# Said (on stderr) by every prune whose policy names no kind: an empty policy deletes no episode.
NO_EPISODE_POLICY = (
    "no episode retention policy: [retention] names no kind, so no episode is deleted; add e.g. "
    'raw = "30d", summary = "365d" to the configuration or give a file with --policy FILE '
    "(an empty policy never means 'delete all')"
)


def _default_job_age() -> str:
    from memctl.config import RETENTION_DEFAULTS

    return RETENTION_DEFAULTS[JOBS]


def policy_from_settings(settings) -> Policy:
    return Policy.from_section(dict(settings.retention))


def read_policy(path: str | Path) -> Policy:
    """The [retention] table of another TOML file, validated like the configuration's."""
    from memctl import config

    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(f"{path}: no such policy file")
    table = config.read_section(path, "retention")
    if table is None:
        raise ConfigError(f'{path}: no [retention] table (e.g. [retention] raw = "30d")')
    return Policy.from_section(table)
