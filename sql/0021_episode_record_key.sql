-- An imported record already stored is recognised and skipped (docs/ingest.md, "A record stored once"):
-- `episode import`, `ingest` and nothing else set record_key, 16 bytes of sha256 over the record's agent,
-- source, time (as given; a record with no time: its occurrence in the stream) and admitted content
-- (memctl.records.identity). NULL for every other write, so the index holds imported rows only. Unique
-- with the agent (the distribution column on Citus): two copies of one record cannot both be stored.
ALTER TABLE episodes ADD COLUMN record_key bytea;
CREATE UNIQUE INDEX episodes_record_key_idx ON episodes (agent, record_key) WHERE record_key IS NOT NULL;

-- Where a stream fed to `memctl ingest --cursor-file` was read to: written in the transaction of the batch
-- that ends there, so a restart (after kill -9 too) resumes at the last committed record. `name` is the
-- cursor file's absolute path; `position` a journald __CURSOR or a byte offset into a file.
CREATE TABLE ingest_cursors (
    name text PRIMARY KEY,
    position text NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
