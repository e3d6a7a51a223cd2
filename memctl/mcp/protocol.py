"""The protocol side of `memctl mcp`: memctl.mcp.tools's tools served with the official MCP SDK.

Imported only by `memctl mcp` (the SDK and pydantic take about a second to import; no other
command pays it). The functions below declare the tools: their parameters are the input
schema (types, bounds, descriptions), their docstrings what the agent reads, their return
annotation the output schema where there is one. build() binds each to the session's
implementation in memctl.mcp.tools. A tool's failure is an error result carrying memctl's
one-line message (secrets masked), never a traceback, and the server goes on serving.
stdout carries the protocol only: the SDK's stdio transport diverts file descriptor 1 to
stderr for everything else, and every log line goes to stderr as `memctl: mcp: ...`.
"""

import functools
import inspect
import logging
import threading
from typing import Annotated, Any, Callable, Literal, Optional

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field, ValidationError
from typing_extensions import TypedDict

from memctl import __version__
from memctl.config import mask_secrets
from memctl.db import migrate
from memctl.errors import MemctlError, SchemaChanged, Unavailable
from memctl.mcp import sessions, tools
from memctl.records import filters

log = logging.getLogger("memctl.mcp")
# Set when a call met a schema newer than this memctl (a newer memctl migrated the memory meanwhile): its write was
# refused and nothing of it stored; the HTTP server stops (exit 75) so its unit starts the memctl installed now.
schema_changed = threading.Event()

# ---------------------------------------------------------------------------
# Parameters

Name = Annotated[Optional[str], Field(min_length=1, max_length=tools.MAX_NAME)]
Key = Annotated[
    str, Field(description="The fact's key, e.g. db.host.", min_length=1, max_length=255)
]
Namespace = Annotated[
    Optional[str],
    Field(
        description="Namespace of the fact. Default: this server's namespace; a server started for an agent reads "
        "only its own namespace and the shared ones it was given.",
        min_length=1,
        max_length=tools.MAX_NAME,
    ),
]
When = Annotated[
    Optional[str],
    Field(
        description="now, a duration back from now (30m, 12h, 7d) or an ISO 8601 date/time (2026-08-11T09:30:00Z).",
        min_length=1,
        max_length=64,
    ),
]


# ---------------------------------------------------------------------------
# Structured results with a schema (the client checks them)


class Hit(TypedDict):
    id: int
    text: str
    score: float
    created_at: str
    kind: str
    source: Optional[str]
    agent: str
    importance: int


class SearchResult(TypedDict):
    results: list[Hit]
    mode: str
    degraded: bool
    warning: Optional[str]


class RememberResult(TypedDict, total=False):
    stored: bool
    id: Optional[int]
    agent: str
    kind: str
    source: str
    importance: int
    redacted: int
    redacted_kinds: dict[str, int]
    reason: str


class RecallResult(TypedDict):
    text: str
    items: list[dict[str, Any]]
    tokens: int
    max_tokens: int
    left_out: int
    mode: str
    token_counter: str
    degraded: bool
    warnings: list[str]


# ---------------------------------------------------------------------------
# The tools, declared (bodies are bound in build())


def remember(
    content: Annotated[
        str,
        Field(
            description="What happened, in plain words: an event, a decision, its outcome, a lesson learned. "
            "Secrets (passwords, tokens, keys) are redacted before anything is stored, or the write is "
            "refused, as memctl's [redaction] mode says. At most memctl's [limits] episode_bytes "
            "(1 MiB by default) of UTF-8.",
            min_length=1,
        ),
    ],
    kind: Annotated[
        Name,
        Field(
            description="observation (default), conversation, decision, ...; sets the "
            "default importance. Kinds of importance 0 are not stored."
        ),
    ] = None,
    importance: Annotated[
        Optional[int],
        Field(
            description="0 (do not store) to 10; default by kind from memctl's [importance] policy.",
            ge=0,
            le=10,
        ),
    ] = None,
) -> Annotated[CallToolResult, RememberResult]:
    """Store an episode in long-term memory: something that happened, to be found later by search and recall.

    It is stored at once (searchable by words immediately, by meaning once embedded), as this server's agent
    and source. The answer says whether it was stored, its id, and whether secrets were redacted."""


def search(
    query: Annotated[
        str,
        Field(
            description="What to look for, in words; meaning and words both count. A leading - excludes a word, "
            '"quotes" keep a phrase.',
            min_length=1,
            max_length=tools.MAX_QUERY,
        ),
    ],
    k: Annotated[int, Field(description="How many episodes to return.", ge=1, le=50)] = 5,
    kind: Annotated[Name, Field(description="Only episodes of this kind.")] = None,
    since: Annotated[When, Field(description=f"Only episodes {filters.SINCE} this.")] = None,
    until: Annotated[When, Field(description=f"Only episodes {filters.UNTIL} this.")] = None,
    mode: Annotated[
        Literal["hybrid", "vector", "text"],
        Field(
            description="hybrid (default): meaning and words; vector: meaning only (fails while the embedder is "
            "down); text: words only."
        ),
    ] = "hybrid",
) -> Annotated[CallToolResult, SearchResult]:
    """Search past episodes by meaning and by words, best first, weighted by recency and importance.

    Each result has its id, text, score, created_at, kind and source. When the embedder is down or slow the
    search answers from words alone and says so (degraded: true, with a warning)."""


def recall(
    observation: Annotated[
        str,
        Field(
            description="What you see or are about to decide, in words.",
            min_length=1,
            max_length=tools.MAX_QUERY,
        ),
    ],
    max_tokens: Annotated[
        Optional[int],
        Field(
            description="Budget for the whole block (default: memctl's recall.max_tokens, 1000).",
            ge=1,
            le=100_000,
        ),
    ] = None,
    k: Annotated[
        int, Field(description="At most this many facts, episodes and runbooks each.", ge=1, le=20)
    ] = 5,
) -> Annotated[CallToolResult, RecallResult]:
    """The memory worth putting in your prompt now: current facts, then relevant past episodes (with their age
    and source), then runbooks by name, as whole items within max_tokens. Call it at the start of a task.

    The text is the block to read as it is; nothing relevant gives an empty block."""


def episode_get(
    id: Annotated[
        int, Field(description="The episode's id, as search returns it.", ge=1, le=2**63 - 1)
    ],  # noqa: A002
) -> CallToolResult:
    """One episode by id: its full text, kind, source, importance, created_at and meta."""


def fact_get(
    key: Key,
    namespace: Namespace = None,
    as_of: Annotated[
        When,
        Field(
            description="The value valid at this time (ISO 8601, or a duration back such as "
            "3d); default: now."
        ),
    ] = None,
) -> CallToolResult:
    """The value of a fact by its exact key: what is true now, or with as_of what was true then."""


def fact_list(
    prefix: Annotated[
        Optional[str], Field(description="Only keys starting with this, e.g. db.", max_length=255)
    ] = None,
    namespace: Namespace = None,
) -> CallToolResult:
    """The facts of a namespace, sorted by key (the first 500)."""


def fact_set(
    key: Key,
    value: Annotated[
        str,
        Field(
            description="The new value, at most memctl's [limits] value_bytes (64 KiB by "
            "default). Secrets are redacted or refused as for remember."
        ),
    ],
    namespace: Annotated[
        Optional[str],
        Field(
            description="Default and, on a server started for an agent, the only one: this server's namespace.",
            min_length=1,
            max_length=tools.MAX_NAME,
        ),
    ] = None,
) -> CallToolResult:
    """Set a fact: what is true now, by key (e.g. db.host = 10.8.0.4). The old value moves to the history."""


def fact_history(key: Key, namespace: Namespace = None) -> CallToolResult:
    """Every change of a fact, oldest first: version, time, old and new value, source."""


def runbook_list() -> CallToolResult:
    """The runbooks (procedures kept in git): name, title, description. Read them here; only the operator
    runs them."""


def runbook_show(
    name: Annotated[
        str,
        Field(
            description="The runbook's name, as runbook_list gives it.",
            min_length=1,
            max_length=131,
        ),
    ],
    at: Annotated[
        Optional[str],
        Field(description="Show it as it was at this git commit.", min_length=1, max_length=64),
    ] = None,
) -> CallToolResult:
    """A runbook's title, description and numbered steps with their commands, at a known commit."""


# One declaration above for each tool of the catalogue (tools.TOOLS, the one list of tools), in its order:
# a tool added there without a declaration here fails at import.
DECLARED = [globals()[name] for name in tools.TOOLS]
READ = ToolAnnotations(read_only_hint=True, open_world_hint=False)
WRITE = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False
)


# ---------------------------------------------------------------------------
# Calls and errors


def _clean(message: str) -> str:
    """An error for the agent: one line, passwords masked, any secret in it redacted."""
    text = mask_secrets(" ".join(message.split())) or "error"
    try:
        from memctl import redact

        return redact.redact_text(text) or text
    except Exception:  # the message stays masked; an error path must not fail
        return text


def _error(message: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=message)], is_error=True)


def answer(
    name: str, session: sessions.Session | Callable[[], sessions.Session], arguments: dict[str, Any]
) -> CallToolResult:
    """Run one tool; memctl's errors (and anything unexpected) become an error result, never a traceback.

    `session` may be a function giving the session of this call's agent (the HTTP server's, by token)."""
    implementation, writes = tools.TOOLS[name]
    try:
        if callable(session):
            session = session()
        if writes and session.scope.read_only:
            raise MemctlError(f"{name} writes, and agent {session.scope.agent!r} is read-only")
        try:
            reply = implementation(session, **arguments)
        except (
            sessions.Stale
        ):  # a read on a connection the server had just ended: once more, on a new one
            reply = implementation(session, **arguments)
    except SchemaChanged as exc:
        schema_changed.set()
        return _error(_clean(f"{exc}; call again in a few seconds"))
    except MemctlError as exc:
        message = _clean(str(exc))
        if isinstance(exc, Unavailable):
            log.warning("%s: %s", name, message)
        return _error(message)
    except UnicodeError:
        return _error("the text is not valid Unicode (a lone surrogate?): send UTF-8 text")
    except Exception as exc:  # a defect: say which, keep serving, print no traceback
        if migrate.is_guard_refusal(
            exc
        ):  # the schema refused the write: a newer memctl migrated it
            schema_changed.set()
            return _error(
                f"{name}: nothing was stored: this memory's schema changed (a newer memctl migrated it) "
                "and this server stops so the memctl installed now serves; call again in a few seconds"
            )
        log.error("%s failed unexpectedly: %s; the server goes on", name, type(exc).__name__)
        return _error(f"internal error in {name} ({type(exc).__name__}); the server goes on")
    return CallToolResult(
        content=[TextContent(type="text", text=reply.text)], structured_content=reply.data
    )


def _bind(declared, session, inline: bool):
    """The tool's body for the SDK. The SDK runs a plain function in a worker thread, so that calls may run
    side by side (HTTP: many agents); an async one on the event loop itself. `inline` (stdio) takes the
    second: one client, one connection, calls one at a time whatever thread runs them, and the thread
    hop was a tenth of a search tool call's time."""
    if inline:

        @functools.wraps(declared)  # the SDK reads the declaration's signature through __wrapped__
        async def on_loop(**arguments):
            return answer(declared.__name__, session, arguments)

        return on_loop

    @functools.wraps(declared)
    def call(**arguments):
        return answer(declared.__name__, session, arguments)

    return call


class Server(MCPServer):
    """MCPServer that refuses arguments a tool does not take (an agent's server has no `agent` to pass), says what
    is wrong with an argument in one line (not pydantic's report, its links and the value sent back), and lists to
    each caller the tools its scope offers (`scope_of`: HTTP's, by the request's token; a read-only agent's list
    holds no tool that writes)."""

    def __init__(
        self,
        *args: Any,
        parameters: dict[str, set[str]],
        scope_of: Callable[[], sessions.Scope] | None = None,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self._parameters = parameters
        self._scope_of = scope_of

    async def list_tools(self):
        listed = await super().list_tools()
        if self._scope_of is None:
            return listed
        offered = set(tools.offered(self._scope_of()))
        return [tool for tool in listed if tool.name in offered]

    async def call_tool(self, name: str, arguments: dict[str, Any], context=None):
        known = self._parameters.get(name)
        unknown = sorted(set(arguments) - known) if known is not None else []
        if unknown and known is not None:
            takes = ", ".join(sorted(known)) or "no arguments"
            raise ToolError(f"{name} does not take {', '.join(unknown)}; it takes {takes}")
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            if not isinstance(exc.__cause__, ValidationError):
                raise
            raise ToolError(f"{name}: {invalid(exc.__cause__)}") from None


def invalid(error: ValidationError) -> str:
    """Pydantic's report on a tool's arguments as one line: each argument named with what it must be; the value
    sent is not repeated, nor are pydantic's links."""
    said = []
    for problem in error.errors(include_url=False, include_input=False):
        where = ".".join(str(part) for part in problem["loc"]) or "arguments"
        said.append(f"{where}: {problem['msg']}")
    return "invalid arguments: " + "; ".join(dict.fromkeys(said))


INSTRUCTIONS = (
    "memctl: long-term memory on PostgreSQL. Call recall at the start of a task; remember what "
    "happened and what you learned; facts hold what is true now, by key. {scope}. No tool deletes, "
    "purges or runs a runbook: those are the operator's."
)


def build(
    session: sessions.Session | Callable[[], sessions.Session],
    *,
    scope: sessions.Scope | None = None,
    describe: str | None = None,
    inline: bool = False,
    **options: Any,
) -> Server:
    """The server of one session (stdio), or of a function giving each call's session (HTTP: `scope` says which
    tools to offer, `describe` the instructions' scope, `options` go to MCPServer: the token verifier).
    `inline`: run the tools on the event loop, one at a time (stdio's one session; see _bind)."""
    if scope is None:
        assert isinstance(
            session, sessions.Session
        )  # a function giving sessions comes with its scope (HTTP)
        scope = session.scope
    offered = set(tools.offered(scope))
    declared = [d for d in DECLARED if d.__name__ in offered]
    made = []
    for item in declared:
        writes = tools.TOOLS[item.__name__][1]
        tool = Tool.from_function(
            _bind(item, session, inline), name=item.__name__, annotations=WRITE if writes else READ
        )
        if (
            tool.fn_metadata.output_schema is not None
        ):  # the SDK reads the field live (FuncMetadata's doc)
            tool.fn_metadata.output_schema = published(tool.fn_metadata.output_schema)
        made.append(tool)
    return Server(
        "memctl",
        version=__version__,
        instructions=INSTRUCTIONS.format(scope=describe or scope.describe()),
        log_level="WARNING",
        tools=made,
        parameters={d.__name__: set(inspect.signature(d).parameters) for d in declared},
        scope_of=(lambda: session().scope) if callable(session) else None,
        **options,
    )


def published(schema: dict[str, Any]) -> dict[str, Any]:
    """An output schema as a client checks it fastest, passing the same values: each definition written out
    where it is used (no $ref, no $defs), and a value that may be null as a list of types rather than an
    anyOf. The SDK's client checks every structured result against it (jsonschema, in Python): a search
    result's check took a third less time so (docs/benchmarks.md)."""
    definitions = schema.get("$defs", {})

    def written_out(node: Any, within: tuple[str, ...]) -> Any:
        if isinstance(node, list):
            return [written_out(item, within) for item in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            name = node["$ref"].rsplit("/", 1)[-1]
            if name in within:
                raise ValueError(
                    f"output schema: {name} refers to itself; it cannot be written out"
                )
            rest = {key: value for key, value in node.items() if key != "$ref"}
            return written_out({**definitions[name], **rest}, within + (name,))
        node = {key: written_out(value, within) for key, value in node.items() if key != "$defs"}
        options = node.get("anyOf")
        if options and all(
            set(option) == {"type"} and isinstance(option["type"], str) for option in options
        ):
            node = {key: value for key, value in node.items() if key != "anyOf"}
            node["type"] = [option["type"] for option in options]
        return node

    return written_out(schema, ())


class _OneLine(logging.Formatter):
    """memctl's stderr form: one line, `memctl: mcp: ...`, secrets masked, no traceback ever."""

    def format(self, record: logging.LogRecord) -> str:
        return f"memctl: mcp: {mask_secrets(' '.join(record.getMessage().split()))}"


def configure_logging() -> None:
    """Every log line (memctl's and the SDK's) to stderr in memctl's form, warnings and errors only."""
    handler = logging.StreamHandler()
    handler.setFormatter(_OneLine())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)


def serve(session: sessions.Session) -> None:
    """Serve over stdio until the client closes its end, answering every request it sent first."""
    import anyio

    from memctl.mcp import transport

    configure_logging()
    limits = session.settings.limits
    anyio.run(
        transport.serve,
        build(session, inline=True),
        transport.line_limit(max(limits.episode_bytes, limits.value_bytes)),
    )
