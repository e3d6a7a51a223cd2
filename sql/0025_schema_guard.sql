-- A writer older than the schema is refused by the schema itself (DESIGN.md decision 15, docs/releases.md).
-- The memctl already installed on a VPS (a systemd unit's venv, an agent's) never learns a newer schema's
-- rules: it would keep writing with its old gate, old repeat folding, deletes without the erasure ledger.
-- So every session memctl opens declares the newest migration it knows (the setting memctl.schema, set at
-- connection start by memctl.db.connect; the migrator declares the newest file it applies), and a
-- statement-level trigger on each of memctl's tables refuses an INSERT, UPDATE, DELETE, MERGE, COPY ... FROM
-- or TRUNCATE from a session that declares an older migration than the newest applied here, or none (every
-- memctl before 0.2.0). Reads are never refused. It is a check against an honest old memctl, not a wall
-- against a hostile one: any session may declare what it likes.
--
-- Exempt: memctl_migrations (the migrator's record) and episode_access (what a read records: an older
-- memctl's search or recall still answers, and the row holds no memory text). Tables made later get the
-- guard too: memctl_guard_all() runs after every migrate (memctl.db.migrate.apply), and a model's vector
-- table is guarded when it is made (memctl.embedding.models.register), as it gets row-level security.
-- Agents' roles cannot read memctl_migrations: the trigger's function is SECURITY DEFINER, its search_path
-- pinned to memctl's schema, pg_catalog and pg_temp last (set below, as the schema is only known here).
-- On Citus nothing is guarded (memctl_guard returns false), as agents' row-level security is not set there.

CREATE OR REPLACE FUNCTION memctl_schema_guard() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    declared text := pg_catalog.current_setting('memctl.schema', true);
    schema_at text := (SELECT pg_catalog.max(m.name COLLATE "C") FROM memctl_migrations m);
BEGIN
    IF coalesce(declared, '') COLLATE "C" < schema_at THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MC051',
            MESSAGE = pg_catalog.format(
                '%s on %s refused: this memory''s schema is at %s and the writing memctl knows %s: a memctl older '
                'than the schema may not write into it', TG_OP, TG_TABLE_NAME, schema_at,
                coalesce(nullif(declared, ''), 'none (a memctl before 0.2.0)')),
            HINT = 'upgrade memctl (pip install -U memctl) in every environment that writes here, the systemd '
                   'units'' too; reads go on';
    END IF;
    RETURN NULL;
END
$$;

-- The guard on one table; idempotent (a table that has it is not locked again).
CREATE OR REPLACE FUNCTION memctl_guard(tbl regclass) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
        RETURN false;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_trigger WHERE tgrelid = tbl AND tgname = 'memctl_schema_guard') THEN
        EXECUTE pg_catalog.format('CREATE TRIGGER memctl_schema_guard BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE '
                                  'ON %s FOR EACH STATEMENT EXECUTE FUNCTION memctl_schema_guard()', tbl);
    END IF;
    RETURN true;
END
$$;

-- Every table of memctl's schema but the exempt ones and an extension's: the catalog's, not a list.
CREATE OR REPLACE FUNCTION memctl_guard_all() RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    guarded integer := 0;
    tbl regclass;
BEGIN
    FOR tbl IN
        SELECT c.oid FROM pg_catalog.pg_class c
        WHERE c.relnamespace = pg_catalog.current_schema()::regnamespace AND c.relkind IN ('r', 'p')
          AND c.relname NOT IN ('memctl_migrations', 'episode_access')
          AND NOT EXISTS (SELECT FROM pg_catalog.pg_depend d WHERE d.classid = 'pg_catalog.pg_class'::regclass
                          AND d.objid = c.oid AND d.deptype = 'e')
        ORDER BY c.relname
    LOOP
        IF memctl_guard(tbl) THEN
            guarded := guarded + 1;
        END IF;
    END LOOP;
    RETURN guarded;
END
$$;

DO $$
BEGIN
    EXECUTE pg_catalog.format('ALTER FUNCTION memctl_schema_guard() SET search_path = %I, pg_catalog, pg_temp',
                              pg_catalog.current_schema());
    EXECUTE pg_catalog.format('ALTER FUNCTION memctl_guard(regclass) SET search_path = %I, pg_catalog, pg_temp',
                              pg_catalog.current_schema());
    EXECUTE pg_catalog.format('ALTER FUNCTION memctl_guard_all() SET search_path = %I, pg_catalog, pg_temp',
                              pg_catalog.current_schema());
END
$$;
REVOKE ALL ON FUNCTION memctl_schema_guard() FROM PUBLIC;
REVOKE ALL ON FUNCTION memctl_guard(regclass) FROM PUBLIC;
REVOKE ALL ON FUNCTION memctl_guard_all() FROM PUBLIC;

SELECT memctl_guard_all();
