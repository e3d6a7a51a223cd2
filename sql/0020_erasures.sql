-- The erasure ledger (docs/retention.md, memctl.records.erasures): one row per purge, fact erasure,
-- episode delete, redaction fix and prune of a blocked source's episodes, saying what was erased (ids,
-- source, key, time, counts) and keyed digests of the erased texts (HMAC-SHA256 under a key kept in
-- MEMCTL_HOME/erasure/key, outside the database): never a text. The same entries are appended to
-- MEMCTL_HOME/erasure/ledger.jsonl, so losing either keeps the other; `memctl restore` re-applies every
-- entry newer than its backup, and `memctl erasure verify` looks for the digests in what is live.
CREATE TABLE erasures (
    id        text        PRIMARY KEY,              -- a uuid, the same in the file
    erased_at timestamptz NOT NULL,
    op        text        NOT NULL CHECK (op IN ('purge', 'fact_erase', 'episode_delete', 'redact_fix',
                                                 'prune_blocked')),
    source    text,                                 -- purge: the source; prune_blocked: the blocked sources
    target    text,                                 -- fact_erase: namespace/key; purge: --since
    key_id    text        NOT NULL,                 -- which key made the digests (sha256 of it, 16 hex)
    counts    jsonb       NOT NULL DEFAULT '{}',    -- rows removed per table
    items     jsonb       NOT NULL DEFAULT '{}'     -- ids and digests (memctl.records.erasures.Entry)
);
CREATE INDEX erasures_at_idx ON erasures (erased_at);
