"""Runbooks for the tests: a runbook's Markdown from its steps, and a git repository of runbooks."""

from __future__ import annotations

from pathlib import Path


def md(title: str, steps: list[tuple[str, str]], description: str = "What it does.") -> str:
    body = "".join(f"## {n}. {t}\n\n```sh\n{c}\n```\n\n" for n, (t, c) in enumerate(steps, 1))
    return f"# {title}\n\n{description}\n\n{body}"


def make_repo(path: Path, files: dict[str, str], message: str = "add runbooks"):
    import git

    path.mkdir(parents=True, exist_ok=True)
    repo = git.Repo.init(path)
    with repo.config_writer() as config:
        config.set_value("user", "name", "Test Operator")
        config.set_value("user", "email", "ops@example.com")
    commit(repo, files, message)
    return repo


def commit(repo, files: dict[str, str], message: str) -> str:
    root = Path(repo.working_tree_dir)
    for name, text in files.items():
        (root / name).write_text(text)
    repo.index.add(list(files))
    return repo.index.commit(message).hexsha
