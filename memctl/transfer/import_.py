"""`memctl import`: an export's JSONL stream (format: memctl.transfer.export) back into memory.

Import runs in one transaction: a corrupt or unknown line fails it, naming the line, and
nothing is left behind. Every record passes the write gate (memctl.write.gate): a record from a
source blocked in this database refuses the import; the file's own blocked sources are
added and refuse later writes, while the file's records from them (accepted where they were
written, before the block) are restored as they were. Chunks are made anew from each
episode's admitted text: a vector in the file is kept only for a chunk whose text is exactly
the chunk made here. Episodes are deduplicated by their record_key, else by (agent, content hash,
created_at) (memctl.transfer.known), their record_key kept as the file gives it; fact
histories merged in version order, lineage and run records remapped to the new episode ids,
every text redacted on the way in. Vectors are used when the target's active model is the
header's (or the target has none yet: the model is registered from the header, no embedder
needed); otherwise, or when redaction changed an episode, its chunks are made anew and queued.
"""

from __future__ import annotations

import datetime
import json
import math
import re
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from memctl import __version__, redact

from memctl.files import jsonl
from memctl.config import Settings
from memctl.db import locks
from memctl.embedding import models
from memctl.errors import BadValue, Blocked, InvalidInput
from memctl.write import admission, erased, gate, repeats, store
from memctl.transfer.export import FORMAT, TYPES
from memctl.transfer.known import Known, Pending, holders, resolve
from memctl.transfer.merge_facts import merge_fact

if TYPE_CHECKING:
    from memctl.db.memory import Memory

BATCH = 2000


@dataclass
class ImportResult:
    blocked_sources: int = 0
    facts: int = 0
    fact_changes: int = 0  # history entries added
    episodes: int = 0
    duplicates: int = 0
    folded: int = (
        0  # of the episodes, stored as repeats of a first (memctl.write.repeats): not embedded
    )
    chunks: int = 0
    vectors: int = 0  # vectors taken from the file
    queued: int = 0  # chunks queued for embedding
    summary_sources: int = 0
    runbook_runs: int = 0
    dropped: int = 0  # importance 0 by the write policy
    chunks_remade: int = (
        0  # episodes whose file chunks differed from the chunks made here: vectors not used
    )
    agent_roles_made: int = (
        0  # registered agents' roles made on this server after the import (memctl.db.wall)
    )
    erased: int = (
        0  # records (and fact values) the erasure ledger holds: left out (memctl.write.erased)
    )
    redactor: redact.Redactor = field(default_factory=redact.Redactor)

    def to_dict(self) -> dict:
        data = asdict(self)
        data.pop("redactor")
        data["redacted"] = self.redactor.count
        return data


FIELDS = {
    "header": (
        {
            "type",
            "format",
            "memctl",
            "models",
            "vectors",
            "exported_at",
            "agent",
            "since",
            "digest_key",
        },
        ("format",),
    ),
    "blocked_source": ({"type", "source", "reason", "blocked_at"}, ("source",)),
    "fact": (
        {
            "type",
            "namespace",
            "key",
            "value",
            "source",
            "version",
            "updated_at",
            "valid_from",
            "history",
        },
        ("namespace", "key", "history"),
    ),
    "episode": (
        {
            "type",
            "id",
            "agent",
            "kind",
            "source",
            "importance",
            "created_at",
            "meta",
            "content",
            "chunks",
            "repeat_of",
            "record_key",
        },
        ("id", "agent", "content", "created_at"),
    ),
    "summary_source": (
        {"type", "agent", "summary_id", "source_id", "source_created_at", "source_hash"},
        ("agent", "summary_id", "source_id", "source_created_at", "source_hash"),
    ),
    "runbook_run": (
        {
            "type",
            "agent",
            "name",
            "commit",
            "dirty",
            "started_at",
            "finished_at",
            "outcome",
            "steps",
            "from_step",
            "failed_step",
            "exit_code",
            "duration_s",
            "output_tail",
            "episode_id",
        },
        ("agent", "name", "commit", "started_at", "outcome", "steps"),
    ),
}


def records(lines: Iterable[bytes]) -> Iterator[tuple[int, dict]]:
    """(line number, record) with the header checked first and every record's type and fields checked."""
    first = True
    for number, item in jsonl.read(lines, required=("type",)):
        kind = item["type"]
        if first and kind != "header":
            raise jsonl.LineError(
                number, f"expected the header line of a memctl export first, got type {kind!r}"
            )
        if kind not in FIELDS or (kind == "header" and not first):
            raise jsonl.LineError(
                number, f"unknown record type {kind!r}, expected one of {', '.join(TYPES[1:])}"
            )
        allowed, required = FIELDS[kind]
        unknown = set(item) - allowed
        missing = [name for name in required if name not in item]
        if unknown or missing:
            what = (
                f"unknown field(s) {', '.join(sorted(unknown))}"
                if unknown
                else f"missing {', '.join(missing)}"
            )
            raise jsonl.LineError(number, f"{kind}: {what}")
        if first:
            _check_header(number, item)
            first = False
        yield number, item
    if first:
        raise InvalidInput("empty input: an export starts with its header line")


def _check_header(number: int, header: dict) -> None:
    version = header["format"]
    if isinstance(version, bool) or not isinstance(version, int):
        raise jsonl.LineError(number, f"header: format must be an integer, got {version!r}")
    if version > FORMAT:
        raise InvalidInput(
            f"this export is format {version} (written by memctl {header.get('memctl', '?')}); "
            f"this memctl {__version__} reads format {FORMAT} and older: upgrade memctl to import it"
        )


def import_stream(
    conn: Memory, lines: Iterable[bytes], *, redactor: redact.Redactor | None = None
) -> ImportResult:
    """Load an export in one transaction: all of it, or (on any bad line) nothing."""
    settings = conn.settings
    import psycopg

    result = ImportResult(
        redactor=redactor if redactor is not None else redact.Redactor.from_settings(settings)
    )
    admit = gate.Gate(conn, settings, result.redactor, bulk=True)
    with (
        admit.writing()
    ):  # a source blocked while the file was read: refused at the end, nothing kept
        conn.execute("SET LOCAL gin_pending_list_limit = '64MB'")
        conn.execute(locks.WRITE_LOCK)
        loader = _Loader(conn, result, admit)
        for number, item in records(lines):
            try:
                loader.add(number, item)
            except jsonl.LineError:
                raise
            except (InvalidInput, BadValue, Blocked) as exc:
                raise jsonl.at(number, exc) from None
            except (psycopg.DataError, psycopg.IntegrityError) as exc:
                # A value of the wrong type or range: the record (or, for episodes, the batch it ends) is refused.
                raise jsonl.LineError(
                    number,
                    f"{item['type']}: rejected by the database: {str(exc).strip().splitlines()[0]}",
                ) from None
        loader.flush()
        if loader.index_later is not None:
            conn.execute(models.index_statement(loader.index_later, concurrently=False))
    result.agent_roles_made = _agent_roles(conn)
    return result


def _agent_roles(conn: Memory) -> int:
    """After the import commits: every registered agent's role made again where this server lacks it (an import onto
    another server); where this role may not make one, the import is done but reported failed, with what a DBA
    runs (memctl.db.wall.after_move)."""
    from memctl.db import wall

    try:
        return len(wall.after_move(conn, strict=True)["made"])
    except wall.AgentsUnsupported as exc:
        raise wall.AgentsUnsupported(
            f"the import is done, but agents are not served: {exc}"
        ) from None


@dataclass
class _Described:
    """An embedder as an export's header describes it: enough to register its model without calling it."""

    name: str
    model: str
    request_dims: int | None
    size: int
    storage: str = "vector"
    query_prefix: str = (
        ""  # the instructions the vectors were made with; files written before memctl
    )
    document_prefix: str = ""  # knew them have none, and their vectors were made with none

    def dims(self) -> int:
        return self.size


class _Loader:
    def __init__(self, conn: Memory, result: ImportResult, admit: gate.Gate):
        self.conn, self.settings, self.result = conn, conn.settings, result
        self.gate = admit
        # (agent, id in the file) -> id here, kept in a temporary table: memory stays flat at any size
        for statement in ID_MAP:
            conn.execute(statement)
        self.mapped: list[tuple[str, int, int]] = []
        self.batch: list[tuple[int, gate.NewEpisode, list | None, str | None, bytes | None]] = []
        self.model: models.Model | None = (
            None  # whose vectors the file's chunks carry, when usable here
        )
        self.index_later: models.Model | None = (
            None  # registered by this import, its index not built yet
        )
        self.queued: list[int] = []
        self.now = datetime.datetime.now(datetime.timezone.utc)
        self.window = repeats.window_seconds(self.settings)
        self.locked: set[str] = set()  # agents whose fold lock this import holds
        self._ledger: erased.Ledger | None = None  # read with the header

    def add(self, number: int, item: dict) -> None:
        kind = item["type"]
        if kind != "episode" and self.batch:
            self.flush()
        if kind == "episode":
            self._episode(number, item)
        else:
            getattr(self, f"_{kind}")(item)

    def _header(self, item: dict) -> None:
        described = item.get("vectors")
        if described:
            self.model = self._usable_model(_described(described))
        self.queued = store.queued_models(self.conn)
        self._ledger = erased.Ledger(self.conn, item.get("digest_key"))

    @property
    def ledger(self) -> erased.Ledger:
        assert self._ledger is not None  # the header, checked first (records), read it
        return self._ledger

    def _usable_model(self, described: _Described) -> models.Model | None:
        active = models.active(self.conn)
        if active is None:
            # The index is built once the vectors are in: inserting into an HNSW index one vector at a time
            # ran at about 300 rows/s (measured, 20,000 rows of 384 dims); a build after the load is far faster.
            self.index_later = models.register(
                self.conn, described, state="active", storage=described.storage, build_index=False
            )
            return self.index_later
        same = (
            active.embedder,
            active.model,
            active.dims,
            active.query_prefix,
            active.document_prefix,
        ) == (
            described.name,
            described.model,
            described.size,
            described.query_prefix,
            described.document_prefix,
        )
        return (
            active if same else None
        )  # another model's vectors, or other instructions': re-embedded here

    def _blocked_source(self, item: dict) -> None:
        blocked = self.gate.blocked_source(
            item["source"], item.get("reason"), item.get("blocked_at")
        )
        self.result.blocked_sources += store.insert_blocked(self.conn, blocked, keep_existing=True)

    def _fact(self, item: dict) -> None:
        self.result.erased += self.ledger.clear_facts(item)
        merge_fact(self.conn, self.gate, item, self.result)

    def _episode(self, number: int, item: dict) -> None:
        """Checked here; admitted through the gate at flush, once duplicates of what is stored are set aside."""
        if isinstance(item["id"], bool) or not isinstance(item["id"], int):
            raise BadValue("episode: id: must be an integer", "id")
        given = _given_chunks(item.get("chunks"))
        episode = gate.validate(
            self.settings,
            item["content"],
            kind=item.get("kind"),
            source=item.get("source"),
            agent=item["agent"],
            importance=item.get("importance"),
            created_at=item["created_at"],
            meta=item.get("meta"),
            limits=self.gate.limits,
        )
        episode.line = number
        self.batch.append(
            (item["id"], episode, given, _fold_hint(item), _record_key(item.get("record_key")))
        )
        if len(self.batch) >= BATCH:
            self.flush()

    def admit(self, episode: gate.NewEpisode) -> admission.Episode | None:
        try:
            return self.gate.episode(episode)
        except (InvalidInput, BadValue, Blocked) as exc:
            assert episode.line is not None  # _episode set it
            raise jsonl.at(episode.line, exc) from None

    def vectors(self, episode: admission.Episode, given: list[dict] | None) -> list | None:
        """The file's vectors, only when its chunks are exactly the chunks made here from the admitted text."""
        if self.model is None or not given or episode.redacted:
            return None
        if tuple(c["content"] for c in sorted(given, key=lambda c: c["seq"])) != episode.chunks:
            self.result.chunks_remade += 1
            return None
        vectors = [
            _vector_text(c["embedding"], self.model.dims)
            for c in sorted(given, key=lambda c: c["seq"])
        ]
        return None if any(v is None for v in vectors) else vectors

    def _summary_source(self, item: dict) -> None:
        agent = item["agent"]
        summary = self.new_id(agent, item["summary_id"])
        if summary is None:
            raise InvalidInput(
                f"summary_source: summary {item['summary_id']} of agent {agent!r} is not in the file"
            )
        if (
            summary == erased.ERASED_ID
        ):  # the summary was erased here: its lineage stays out with it
            self.result.erased += 1
            return
        given, keyed = item["source_hash"], self.ledger.lineage(item["source_hash"])
        row = self.gate.lineage(agent, summary, item["source_id"], item["source_created_at"], keyed)
        source = (
            self.new_id(agent, item["source_id"]) or None
        )  # erased here (ERASED_ID): as if pruned
        if source is None:  # pruned before the export: an id that names no episode here
            source = self.ledger.find_source(row.agent, given, row.source_created_at) or -abs(
                row.source_id
            )
        row = self.gate.lineage(
            row.agent, row.summary_id, source, row.source_created_at, row.source_hash
        )
        self.result.summary_sources += store.insert_lineage(self.conn, [row])

    def _runbook_run(self, item: dict) -> None:
        row = {name: item.get(name) for name in FIELDS["runbook_run"][0] if name != "type"}
        row["episode_id"] = (
            self.new_id(item["agent"], item.get("episode_id")) if item.get("episode_id") else None
        )
        row["episode_id"], left_out = self.ledger.erase_run(row, row["episode_id"])
        self.result.erased += left_out
        row["dirty"] = bool(row["dirty"])
        row["from_step"] = row["from_step"] or 1
        row["output_tail"] = row["output_tail"] or ""
        self.result.runbook_runs += store.insert_run(
            self.conn, self.gate.run_record(row), "import"
        ).rowcount

    def new_id(self, agent: str, old_id: Any) -> int | None:
        if isinstance(old_id, bool) or not isinstance(old_id, int):
            raise BadValue(f"an episode id must be an integer, got {old_id!r}", "id")
        if not isinstance(agent, str):
            raise BadValue(f"agent: must be a string, got {agent!r}", "agent")
        row = self.conn.execute(LOOK_UP_ID, (agent, old_id)).fetchone()
        return row["new_id"] if row else None

    def flush(self) -> None:
        if self.batch:
            _insert_episodes(self, self.batch)
            self.batch = []
        if self.mapped:
            with self.conn.cursor() as cur, cur.copy(COPY_IDS) as copy:
                for row in self.mapped:
                    copy.write_row(row)
            self.mapped = []


def _described(described: Any) -> _Described:
    """The header's `vectors`: the model the file's chunk vectors were made with."""
    if not isinstance(described, dict):
        raise BadValue("header: vectors must be an object describing a model", "vectors")
    for name, kind in (("embedder", str), ("model", str), ("dims", int)):
        if isinstance(described.get(name), bool) or not isinstance(described.get(name), kind):
            raise BadValue(f"header: vectors.{name} must be a {kind.__name__}", f"vectors.{name}")
    storage = described.get("storage") or "vector"
    if storage not in ("vector", "halfvec"):
        raise BadValue(
            f"header: vectors.storage must be vector or halfvec, got {storage!r}", "vectors.storage"
        )
    request = described.get("request_dims")
    if request is not None and (isinstance(request, bool) or not isinstance(request, int)):
        raise BadValue("header: vectors.request_dims must be an integer", "vectors.request_dims")
    prefixes = [described.get(name) or "" for name in ("query_prefix", "document_prefix")]
    if not all(isinstance(p, str) for p in prefixes):
        raise BadValue(
            "header: vectors.query_prefix and document_prefix must be strings",
            "vectors.query_prefix",
        )
    return _Described(
        described["embedder"], described["model"], request, described["dims"], storage, *prefixes
    )


def _given_chunks(chunks: Any) -> list[dict] | None:
    """An exported episode's chunks, checked for shape: {seq: int, content: str, embedding: list|null}."""
    if chunks is None:
        return None
    if not isinstance(chunks, list):
        raise BadValue("episode: chunks must be a list", "chunks")
    seen = set()
    for index, chunk in enumerate(chunks):
        if not isinstance(chunk, dict):
            raise BadValue(f"episode: chunks[{index}] must be an object", "chunks")
        seq = chunk.get("seq")
        if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0 or seq in seen:
            raise BadValue(
                f"episode: chunks[{index}].seq must be a distinct integer >= 0, got {seq!r}",
                "chunks",
            )
        seen.add(seq)
        if not isinstance(chunk.get("content"), str):
            raise BadValue(f"episode: chunks[{index}].content must be a string", "chunks")
        if chunk.get("embedding") is not None and not isinstance(chunk["embedding"], list):
            raise BadValue(
                f"episode: chunks[{index}].embedding must be a list of numbers or null", "chunks"
            )
    return chunks


ID_MAP = (
    "DROP TABLE IF EXISTS pg_temp.memctl_import_ids",
    "CREATE TEMPORARY TABLE memctl_import_ids (agent text, old_id bigint, new_id bigint) ON COMMIT DROP",
    "CREATE INDEX ON memctl_import_ids (agent, old_id)",
)
COPY_IDS = "COPY memctl_import_ids (agent, old_id, new_id) FROM STDIN"
LOOK_UP_ID = "SELECT new_id FROM memctl_import_ids WHERE agent = %s AND old_id = %s"
HEX_KEY = re.compile(r"[0-9a-fA-F]{32}")


def _record_key(given: Any) -> bytes | None:
    """An episode's record_key as the file gives it: 32 hex digits (16 bytes), or null for none."""
    if given is None:
        return None
    if not isinstance(given, str) or HEX_KEY.fullmatch(given) is None:
        raise BadValue("episode: record_key: must be 32 hex digits or null", "record_key")
    return bytes.fromhex(given)


def _fold_hint(item: dict) -> str | None:
    """What the file says of a record's folding (memctl.write.repeats): null repeat_of keeps it a first, an id
    folds it into the latest first of its text before it; a file from before repeats were folded says nothing."""
    if "repeat_of" not in item:
        return None
    if item["repeat_of"] is None:
        return repeats.FIRST
    if isinstance(item["repeat_of"], bool) or not isinstance(item["repeat_of"], int):
        raise BadValue("episode: repeat_of: must be an episode id or null", "repeat_of")
    return repeats.REPEAT


def _insert_episodes(
    loader: _Loader, batch: list[tuple[int, gate.NewEpisode, list | None, str | None, bytes | None]]
) -> None:
    """New episodes only (memctl.transfer.known says which are here already), through the gate's COPY writer.

    A record already stored (as it is in the file, or as the gate would store it) is a duplicate and
    stores nothing, so a backup can be imported again whatever was blocked since; every other record
    passes the gate, which refuses a blocked source and redacts, and is stored with the record_key the
    file gives. Repeats fold as the file says, else by [episodes] repeat_window (_fold_hint).
    """
    conn, result = loader.conn, loader.result
    known = Known()
    known.load(conn, list({raw.created_at for _, raw, _, _, _ in batch}))
    fresh, vectors, repeated, hints, keys = [], [], [], [], []
    ledger = erased.Lookup(
        conn, [raw.content for _, raw, _, _, _ in batch], key=loader.ledger.key
    ).kept()
    for (old_id, raw, given, hint, key), kept in zip(batch, ledger):
        if (
            not kept
        ):  # erased here (memctl.write.erased): left out before anything else is asked of it
            loader.mapped.append((raw.agent, old_id, erased.ERASED_ID))
            result.erased += 1
            continue
        slot = known.find((raw.agent, raw.content_hash, raw.created_at), key)
        if slot is None:
            ep = loader.admit(raw)
            if ep is None:  # importance 0: the write policy stores nothing
                result.dropped += 1
                continue
            slot = known.find((ep.agent, ep.content_hash, ep.created_at), key)
        if slot is not None:
            repeated.append((raw.agent, old_id, slot))
            result.duplicates += 1
            continue
        assert ep is not None  # admitted above: a record found here went on
        pending = Pending()
        fresh.append((old_id, ep, raw.agent, pending))  # ids are mapped under the file's agent name
        vectors.append(loader.vectors(ep, given))
        hints.append(hint)
        keys.append(key)
        known.add(
            (ep.agent, ep.content_hash, ep.created_at), key, pending
        )  # a later copy maps to its id
    copied = store.copy_episodes(
        conn,
        [ep for _, ep, _, _ in fresh],
        now=loader.now,
        queued=loader.queued,
        vectors=vectors,
        model=loader.model,
        window=loader.window,
        hints=hints,
        locked=loader.locked,
        keys=keys if any(k is not None for k in keys) else None,
    )
    # The writer skipped a record whose key an episode here holds (at another time: memctl.transfer.known); its
    # ids are the others', in order. Only then are the keys' holders asked.
    held = holders(conn, [ep.agent for _, ep, _, _ in fresh], keys) if copied.already else {}
    stored_now = set(copied.ids) if held else set()
    new_ids, left_out = iter(copied.ids), set(copied.erased)
    for index, ((old_id, ep, agent, pending), key) in enumerate(zip(fresh, keys)):
        if index in left_out:  # the ledger holds it (memctl.write.erased): mapped to no episode
            pending.id = erased.ERASED_ID
            loader.mapped.append((agent, old_id, pending.id))
            continue
        holder = held.get((ep.agent, key)) if key is not None else None
        pending.id = next(new_ids) if holder is None or holder in stored_now else holder
        loader.mapped.append((agent, old_id, pending.id))
    loader.mapped.extend((agent, old_id, resolve(slot)) for agent, old_id, slot in repeated)
    result.episodes += len(copied.ids)
    result.duplicates += copied.already
    result.erased += len(copied.erased)
    result.folded += copied.folded
    result.chunks += copied.chunks
    result.vectors += copied.vectors
    result.queued += copied.queued


def _vector_text(vector: Any, dims: int) -> str | None:
    """pgvector's text form of a chunk's vector (None: the chunk has none and is queued)."""
    if vector is None:
        return None
    if (
        not isinstance(vector, list)
        or len(vector) != dims
        or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
            for x in vector
        )
    ):
        raise BadValue(
            f"episode: a chunk's embedding must be a list of {dims} finite numbers", "chunks"
        )
    return json.dumps(vector)
