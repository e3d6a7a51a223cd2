-- An erasure reaches every copy (docs/retention.md, memctl.places).
--
-- 1. Summary lineage kept a plain sha256 of each source's text (summary_sources.source_hash), and exports wrote it:
-- a guessed sentence could be confirmed against it, after the source itself was pruned or erased. From here on it
-- is keyed: HMAC-SHA256 of that sha256 under the installation's erasure key (MEMCTL_HOME/erasure/key, outside the
-- database; memctl.places.lineage_digest). The key's pads are given by memctl to the session that migrates
-- (memctl.places.key_for_migrations: `memctl db migrate`, the embedded server's own migration, a restore); a
-- migration run without them that finds lineage to rekey stops, changing nothing, and says what to run.
/* memctl:writer */
DO $memctl$
DECLARE
    ipad bytea := pg_catalog.decode(coalesce(pg_catalog.current_setting('memctl.digest_ipad', true), ''), 'hex');
    opad bytea := pg_catalog.decode(coalesce(pg_catalog.current_setting('memctl.digest_opad', true), ''), 'hex');
    n bigint;
BEGIN
    SELECT count(*) INTO n FROM summary_sources;
    IF n = 0 THEN
        RETURN;
    END IF;
    IF pg_catalog.length(ipad) <> 64 OR pg_catalog.length(opad) <> 64 THEN
        RAISE EXCEPTION 'sql/0024 rekeys % summary lineage digest(s) under memctl''s erasure key, which this session '
                        'was not given: run memctl db migrate (it reads MEMCTL_HOME/erasure/key)', n;
    END IF;
    UPDATE summary_sources SET source_hash = pg_catalog.sha256(opad || pg_catalog.sha256(ipad || source_hash));
END
$memctl$;

-- 2. The digests of every ledger entry, one row each, for the look-up on the way in: `memctl import`, `episode
-- import` and `ingest` leave out a record whose keyed digest the ledger holds (memctl.write.erased), one indexed
-- query per batch. Derived from erasures.items (kind: episode, the whole text of an erased episode; quote, the
-- whole value of a row that quoted one): written with each entry (memctl.records.erasures), filled here from the
-- entries there are.
CREATE TABLE erasure_digests (
    digest  text NOT NULL,
    kind    text NOT NULL CHECK (kind IN ('episode', 'quote')),
    erasure text NOT NULL REFERENCES erasures (id) ON DELETE CASCADE,
    PRIMARY KEY (digest, kind, erasure)
);
INSERT INTO erasure_digests (digest, kind, erasure)
SELECT DISTINCT x->>'digest', 'episode', e.id
FROM erasures e CROSS JOIN LATERAL pg_catalog.jsonb_array_elements(coalesce(e.items->'episodes', '[]')) AS x
WHERE x->>'digest' IS NOT NULL;
