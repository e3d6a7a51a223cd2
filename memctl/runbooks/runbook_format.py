"""The runbook format: a Markdown file NAME.md with a title, a description and
numbered steps, each with exactly one fenced ```sh block (the step's command).

Parsing is strict and names the line or step at fault; a name is a file name
and nothing a shell would read.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from memctl.errors import InvalidInput, UsageError

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # whole name: fullmatch
NOT_RUNBOOKS = {"readme"}  # README.md in the runbook directory documents it; it is not a runbook


@dataclass
class Step:
    number: int
    title: str
    command: str
    text: str = ""
    line: int = 0


@dataclass
class Runbook:
    name: str
    title: str
    description: str
    steps: list[Step]
    commit: str | None = None  # repository HEAD (or the commit asked for with --at)
    dirty: bool = False  # the file differs from HEAD or is not committed
    path: str = ""  # path of the file inside the git repository

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------------------
# Names


def check_name(name: str) -> str:
    """The runbook name for NAME or NAME.md; refuses paths and anything a shell would read."""
    if "/" in name or "\\" in name:
        raise UsageError(
            f"runbook name {name!r} is a path: give the file name of a runbook in the repository"
        )
    if ".." in name:
        raise UsageError(f"runbook name {name!r} contains '..'")
    if not NAME.fullmatch(name) or name == ".md":
        raise UsageError(
            f"invalid runbook name {name!r}: use letters, digits, '.', '_' and '-', starting with "
            "a letter or digit, at most 128 characters"
        )
    return name[:-3] if name.endswith(".md") else name


# ---------------------------------------------------------------------------
# Parsing

_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^\s`{]*)")
_TITLE = re.compile(r"^#\s+(.*?)(?:\s+#+)?\s*$")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")
_STEP_HEADING = re.compile(r"^(?:step\s+)?(\d+)(?:[.:)]\s*|\s+|$)(.*)$", re.IGNORECASE)
_STEP_ITEM = re.compile(r"^(\d+)[.)]\s+(.*)$")
_SHELL_LIKE = {"bash", "shell", "zsh", "console", "shell-session", "sh-session", "ksh"}


@dataclass
class _Fence:
    marker: str
    lang: str
    indent: int
    line: int
    raw: list[str] = field(default_factory=list)
    body: list[str] = field(default_factory=list)

    def closes(self, line: str) -> bool:
        stripped = line.strip()
        return stripped.startswith(self.marker) and set(stripped) == {self.marker[0]}

    def code(self) -> str:
        lines = [
            ln[self.indent :] if ln[: self.indent].isspace() else ln.lstrip() for ln in self.body
        ]
        return "\n".join(lines).strip("\n") + "\n"


@dataclass
class _Draft:
    number: int
    title: str
    line: int
    text: list[str] = field(default_factory=list)
    blocks: list[_Fence] = field(default_factory=list)


def parse(text: str, name: str = "") -> Runbook:
    """Title, description and steps of a runbook's Markdown; InvalidInput names the line or step at fault."""
    label = f"runbook {name!r}" if name else "runbook"
    lines = text.splitlines()
    title, start = _title(lines, label)
    description: list[str] = []
    drafts: list[_Draft] = []
    current: _Draft | None = None
    level = _step_heading_level(lines[start:])  # None: steps are numbered list items
    fence: _Fence | None = None
    for number, line in enumerate(lines[start:], start + 1):
        if fence is not None:
            if fence.closes(line):
                fence.raw.append(line)
                _place_block(fence, current, description if not drafts else None, label)
                fence = None
            else:
                fence.body.append(line)
                fence.raw.append(line)
            continue
        opened = _FENCE.match(line)
        if opened:
            fence = _Fence(
                opened.group(2), opened.group(3).lower(), len(opened.group(1)), number, [line]
            )
            continue
        heading = _HEADING.match(line)
        step = _step_marker(line, heading, level)
        if step:
            current = _Draft(int(step.group(1)), step.group(2).strip(" \t-:\u2013\u2014"), number)
            drafts.append(current)
        elif heading and current is not None and (level is None or len(heading.group(1)) <= level):
            current = None  # a section after the steps (notes); a ```sh block there is an error
        elif current is not None:
            current.text.append(line)
        elif not drafts:
            description.append(line)
    if fence is not None:
        raise InvalidInput(f"{label}: line {fence.line}: fenced block is never closed")
    return Runbook(name, title, "\n".join(description).strip(), _steps(drafts, label))


def _step_heading_level(lines: list[str]) -> int | None:
    """The level of the first step heading outside fenced blocks, or None (list-item steps)."""
    fence = None
    for line in lines:
        opened = _FENCE.match(line)
        if fence is not None:
            fence = None if fence.closes(line) else fence
        elif opened:
            fence = _Fence(opened.group(2), "", 0, 0)
        else:
            heading = _HEADING.match(line)
            if heading and _STEP_HEADING.match(heading.group(2)):
                return len(heading.group(1))
    return None


def _step_marker(line: str, heading, level: int | None):
    if level is None:
        return None if heading else _STEP_ITEM.match(line)
    if heading and len(heading.group(1)) == level:
        return _STEP_HEADING.match(heading.group(2))
    return None


def _title(lines: list[str], label: str) -> tuple[str, int]:
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        found = _TITLE.match(line)
        if not found or not found.group(1):
            raise InvalidInput(
                f"{label}: line {index + 1}: expected the title ('# Title') first, found {line[:60]!r}"
            )
        return found.group(1), index + 1
    raise InvalidInput(
        f"{label}: empty; expected a title ('# Title'), a description and numbered steps"
    )


def _place_block(
    fence: _Fence, current: _Draft | None, description: list[str] | None, label: str
) -> None:
    if fence.lang == "sh":
        if current is None:
            raise InvalidInput(f"{label}: line {fence.line}: a ```sh block outside a numbered step")
        current.blocks.append(fence)
    elif fence.lang in _SHELL_LIKE and current is not None:
        raise InvalidInput(
            f"{label}: step {current.number} (line {fence.line}): the block is marked "
            f"{fence.lang!r}; steps run through sh -e, so mark the command ```sh"
        )
    elif current is not None:
        current.text.extend(fence.raw)
    elif description is not None:
        description.extend(fence.raw)


def _steps(drafts: list[_Draft], label: str) -> list[Step]:
    if not drafts:
        raise InvalidInput(
            f"{label}: no steps; number them ('## 1. Title' or '1. Title'), each with one ```sh block"
        )
    steps = []
    for expected, draft in enumerate(drafts, 1):
        where = f"{label}: step {draft.number} (line {draft.line})"
        if draft.number != expected:
            raise InvalidInput(
                f"{where}: steps are numbered 1, 2, 3, ... in order; expected step {expected}"
            )
        if len(draft.blocks) != 1:
            raise InvalidInput(
                f"{where}: has {len(draft.blocks)} ```sh blocks; a step has exactly one"
            )
        command = draft.blocks[0].code()
        if not command.strip():
            raise InvalidInput(f"{where}: its ```sh block is empty")
        steps.append(
            Step(draft.number, draft.title, command, "\n".join(draft.text).strip(), draft.line)
        )
    return steps
