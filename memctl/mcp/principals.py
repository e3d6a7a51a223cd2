"""Which agent a server serves, as the registry says (memctl.records.agents): its scope and its role.

`memctl mcp --agent A` on stdio: a registered A is served in its role with the registry's namespaces
(options may narrow them, never widen); an unregistered A is refused where agents are registered,
and served as before (memctl's SQL scope alone, the owner's rights) with a warning where none is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from memctl.errors import DatabaseUnavailable, UsageError
from memctl.mcp import sessions
from memctl.records import agents

if TYPE_CHECKING:
    from memctl.db.memory import Memory


def scope_of(
    agent: agents.Agent, *, source: str | None = None, read_only: bool = False
) -> sessions.Scope:
    return sessions.Scope.make(
        agent=agent.name,
        namespace=agent.namespace,
        shared=list(agent.shared),
        read_only=agent.read_only or read_only,
        source=source,
    )


def narrowed(
    agent: agents.Agent,
    asked: sessions.Scope,
    *,
    namespace_given: bool,
    shared_given: bool,
    source: str | None,
) -> sessions.Scope:
    """The registry's scope, narrowed by the options; an option that would widen it is refused."""
    if namespace_given and asked.namespace != agent.namespace:
        raise UsageError(
            f"agent {agent.name!r} is registered with namespace {agent.namespace!r}, not "
            f"{asked.namespace!r}: `memctl agent revoke` and `agent add` to change it"
        )
    extra = sorted(set(asked.shared) - set(agent.shared))
    if extra:
        raise UsageError(
            f"agent {agent.name!r} may not read {', '.join(extra)}: it is registered to read "
            f"{', '.join(agent.shared) or 'no shared namespace'}"
        )
    shared = list(asked.shared) if shared_given else list(agent.shared)
    return sessions.Scope.make(
        agent=agent.name,
        namespace=agent.namespace,
        shared=shared,
        read_only=agent.read_only or asked.read_only,
        source=source,
    )


def resolve(
    open_connection: Callable[[], Memory],
    asked: sessions.Scope,
    *,
    namespace_given: bool,
    shared_given: bool,
    source: str | None,
    warn,
) -> sessions.Scope:
    """The stdio server's scope at start. With the database down it stays as asked; the registry is asked
    again when the first call connects (sessions.registered_role)."""
    if asked.agent is None:
        return asked
    try:
        conn = open_connection()
    except DatabaseUnavailable:
        return asked
    try:
        found = agents.show(conn, asked.agent, missing_ok=True)
        if found is None:
            sessions.registered_role(conn, asked.agent)  # refuses when other agents are registered
            warn(
                f"mcp: agent {asked.agent!r} is not registered: its server keeps it in scope by memctl's own "
                f"statements, with the owner's rights; `memctl agent add {asked.agent}` puts it in a role of its "
                "own under row-level security"
            )
            return asked
        agents.grant(conn)  # tables made since the agent was added (a new model's vectors)
        scope = narrowed(
            found, asked, namespace_given=namespace_given, shared_given=shared_given, source=source
        )
        warn(f"mcp: agent {found.name!r} runs in role {found.role} (row-level security)")
        return scope
    finally:
        conn.close()
