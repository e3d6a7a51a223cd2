"""Passwords on command lines (memctl.redact's docstring): `mysql -pX`, `sshpass -p X`, `redis-cli -a X`,
`curl -u user:X`, `docker login -p X`, and `--password X` after any command."""

from __future__ import annotations

import re

from memctl.redact.shapes import Finding, name_kind, placeholder

# A password-taking command, then the rest of its command line (to a pipe, ; or &).
_PASSWORD_COMMAND = re.compile(
    r"(?<![\w./-])(mysql[\w-]*|mariadb[\w-]*|sshpass|redis-cli|curl|(?:docker|podman|nerdctl)[ \t]+login)\b([^\n|;&]*)")
_VALUE = r"(?:(['\"])(.{0,1024}?)\1|([^\s'\"]\S*+))"
_COMMAND_PASSWORD = {
    "mysql": re.compile(r"(?<=\s)-p" + _VALUE),  # attached only: `mysql -p` alone prompts
    "sshpass": re.compile(r"(?<=\s)-p[ \t]*" + _VALUE),
    "redis-cli": re.compile(r"(?<=\s)(?:-a|--pass)[ \t]+" + _VALUE),
    "login": re.compile(r"(?<=\s)(?:-p|--password)(?:[ \t]+|=)" + _VALUE),  # docker login -p
    "curl": re.compile(r"(?<=\s)(?:-u|--user)[ \t]*['\"]?[^\s:'\"]+:" + r"([^\s'\"]+)"),
}


def command_words(text: str, low: str) -> bool:
    return ("mysql" in low or "login" in low and "-p" in text or "fact" in low and "set" in low or "mariadb" in low or "sshpass" in low or "redis-cli" in low
            or "curl" in low and ("-u" in text or "--user" in text))


_OPTION = re.compile(r"(?<![\w-])--([A-Za-z][\w-]{1,40})[ \t]+(?:(['\"])(.{0,1024}?)\2|([^\s'\"-]\S*+))")


def command_findings(text: str) -> list[Finding]:
    """Passwords on command lines: mysql -pX, sshpass -p X, redis-cli -a X, curl -u user:X, --password X."""
    found = []
    for command in _PASSWORD_COMMAND.finditer(text):
        name = command.group(1)
        rule = _COMMAND_PASSWORD["mysql" if name.startswith(("mysql", "mariadb")) else
                                 "login" if name.endswith("login") else name]
        for m in rule.finditer(text, command.start(2), command.end(2)):
            span = (m.start(m.lastindex), m.end(m.lastindex))
            value = text[span[0]:span[1]]
            if len(value) < 3 or placeholder(value) or name[0] == "m" and value.isdigit() and len(value) <= 5:
                continue  # `mysql -p3306`: a port typed with the wrong case; `-pv` another command's flags
            found.append(Finding("password", *span))
    if "--" in text:
        for m in _OPTION.finditer(text):
            kind = name_kind(m.group(1))
            group = 3 if m.group(3) is not None else 4
            value = m.group(group)
            if kind and len(value) >= 3 and "=" not in value and not placeholder(value, m.group(1)):
                found.append(Finding(kind, *m.span(group)))
    return found
