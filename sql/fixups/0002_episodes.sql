-- Fix-up of 0002_episodes.sql as first committed (c7e1950, 17705b6): full text was indexed per chunk, not per
-- episode, and vector tables had no content_hash (sql/templates/vectors.sql changed in the same commit,
-- 4f2d558). A memory made then gets what the released file and template make (memctl.db.migrate: fix-ups).
-- memctl:fixes 0002_episodes.sql 13ed11f535cdeb8ff70f77234bc1e8beec1f7d342bab6c88f58c1a7eeb3c8c66
ALTER TABLE episodes ADD COLUMN tsv tsvector GENERATED ALWAYS AS (to_tsvector('english', left(content, 100000))) STORED;
CREATE INDEX episodes_tsv_idx ON episodes USING gin (tsv);
DROP INDEX IF EXISTS chunks_id_idx, chunks_hash_idx, chunks_fts_idx;

-- Each model's vector table: content_hash, the chunk text's sha256, which the chunk row holds.
DO $$
DECLARE
    vectors text;
BEGIN
    FOR vectors IN
        SELECT m.table_name FROM embedding_models m
        WHERE to_regclass(quote_ident(m.table_name)) IS NOT NULL
          AND NOT EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = to_regclass(quote_ident(m.table_name))
                          AND a.attname = 'content_hash' AND NOT a.attisdropped)
    LOOP
        EXECUTE format('ALTER TABLE %I ADD COLUMN content_hash bytea', vectors);
        EXECUTE format('UPDATE %I v SET content_hash = c.content_hash FROM chunks c '
                       'WHERE c.agent = v.agent AND c.id = v.chunk_id', vectors);
        EXECUTE format('ALTER TABLE %I ALTER COLUMN content_hash SET NOT NULL', vectors);
        EXECUTE format('CREATE INDEX %I ON %I (content_hash)', vectors || '_hash', vectors);
    END LOOP;
END
$$;
