-- Repeats folded (docs/repeats.md, memctl.records.repeats). An episode that repeats an earlier one of the
-- same agent, kind, source and importance (the same normalized text, within [episodes] repeat_window of its
-- last sighting) is stored as a row of its own linked to that first one (repeat_of, same agent), with no chunks:
-- it is never embedded. The first counts the repeat rows linked to it (repeats) and the latest time it was
-- seen (last_seen_at, NULL while it has none). norm_hash: 16 bytes of sha256 of the normalized text, set by
-- every write from this file on (rows written before stay NULL: nothing folds into them).
-- No foreign key from repeat_of: prune deletes a first only once no repeat of it is left, and keeps the
-- counts with the rows it deletes (memctl.upkeep.deletion). New columns with constant defaults rewrite
-- nothing; on Citus the indexes are created on every shard (episodes is distributed by agent).
ALTER TABLE episodes
    ADD COLUMN norm_hash    bytea,
    ADD COLUMN repeat_of    bigint,
    ADD COLUMN repeats      integer NOT NULL DEFAULT 0 CHECK (repeats >= 0),
    ADD COLUMN last_seen_at timestamptz,
    ADD CONSTRAINT episodes_repeat_not_counted CHECK (repeat_of IS NULL OR (repeats = 0 AND last_seen_at IS NULL));

-- A write's look-up: the latest first of an agent with this text (kind, source, importance compared on the row).
CREATE INDEX episodes_first_norm_idx ON episodes (agent, norm_hash, created_at) WHERE repeat_of IS NULL;
-- A first's repeats (search --all, recounts after deletes), and whether any repeat is stored at all.
CREATE INDEX episodes_repeat_of_idx ON episodes (agent, repeat_of, created_at) WHERE repeat_of IS NOT NULL;
