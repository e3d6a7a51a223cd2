-- The agents' wall (docs/agents.md "Threat model"; memctl.db.wall): an agent's role is assumed to run SQL of
-- its own (a login role, `memctl agent add --login`, or a bug that runs text as SQL), and still gets past its
-- rows by no PostgreSQL feature. This file replaces 0019's and 0022's functions and policies:
--
-- * Every SECURITY DEFINER function pins search_path to pg_catalog, memctl's schema and pg_temp LAST (a
--   temporary table named `agents` no longer shadows the registry), and names every object of memctl's
--   schema qualified. The schema is this database's (current_schema(): not always `public`), written into
--   each function by format().
-- * The functions answer only about the role that calls them (the role SET ROLE assumed, or the session's
--   own): asked about another role, they answer as for a role that sees nothing.
-- * A role that has the privileges of an agents' group without being an agent registered here (the groups
--   themselves, reached by SET ROLE; an agent of another database) sees nothing and writes nothing; before,
--   a group role saw every row.
-- * An agent writes only in a session memctl opened (its session user has the owner's privileges, and
--   assumed the agent's role): an agent's own session (a login role) reads its rows and writes nothing, so
--   every write still passes memctl's gate (redaction, blocked sources).
-- * What the write gate reads for an agent comes through narrow functions: the fold key (memctl_fold_key),
--   the blocked sources asked about (memctl_blocked), memctl's locks (memctl_lock, memctl_lock_key: locks on
--   tables no agent may lock, instead of advisory locks any session may take).
-- * EXECUTE on every function here is revoked from PUBLIC and granted to the agents' groups where they need it.
-- * memctl_grant(table): the one home of an agents' group's grants on a memory table; INSERT and UPDATE by
--   column, since a table-level UPDATE grant lets its holder LOCK the whole table against every reader.
DO $wall$
DECLARE
    s text := current_schema();
    pinned text := format('pg_catalog, %I, pg_temp', current_schema());
    caller text := $c$(CASE WHEN pg_catalog.current_setting('role') = 'none' THEN session_user
                            ELSE pg_catalog.current_setting('role')::name END)$c$;
BEGIN
    -- true for a role with an agents' group's privileges that is not the owner's: one that sees nothing unless
    -- registered here. Inside a SECURITY DEFINER function current_user is the function's owner, memctl's.
    EXECUTE format($f$
CREATE OR REPLACE FUNCTION %1$I.memctl_agent_nobody(r name) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = %2$s AS $b$
    SELECT NOT pg_catalog.pg_has_role(r, current_user, 'USAGE')
       AND EXISTS (SELECT FROM pg_catalog.pg_roles g WHERE g.rolname IN ('memctl_agents', 'memctl_agents_write')
                   AND pg_catalog.pg_has_role(r, g.oid, 'MEMBER'))
$b$ $f$, s, pinned);

    -- The agent the calling role stands for; '' for a role that sees nothing (a group, another database's agent,
    -- or a question about a role other than the caller); NULL for any other role (left to its grants).
    EXECUTE format($f$
CREATE OR REPLACE FUNCTION %1$I.memctl_agent_of(role_name name) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = %2$s AS $b$
DECLARE
    registered text;
BEGIN  -- plpgsql, not sql: its statements' plans are kept for the session, not made again per statement
    IF $1 IS DISTINCT FROM %3$s THEN
        RETURN '';
    END IF;
    SELECT a.name INTO registered FROM %1$I.agents a WHERE a.role_name = $1;
    IF registered IS NOT NULL THEN
        RETURN registered;
    END IF;
    RETURN CASE WHEN %1$I.memctl_agent_nobody($1) THEN '' END;
END
$b$ $f$, s, pinned, caller);

    -- The agent whose rows the calling role may write: its own, but only in a session memctl opened (the
    -- session's user has the owner's privileges); '' in the agent's own session and for a role that sees nothing.
    EXECUTE format($f$
CREATE OR REPLACE FUNCTION %1$I.memctl_agent_writer(role_name name) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = %2$s AS $b$
DECLARE
    own text := %1$I.memctl_agent_of($1);
BEGIN
    IF own IS NULL OR own = '' THEN
        RETURN own;
    END IF;
    RETURN CASE WHEN pg_catalog.pg_has_role(session_user, current_user, 'USAGE') THEN own ELSE '' END;
END
$b$ $f$, s, pinned);

    -- The namespaces the calling role reads (its own first); '{}' for a role that sees nothing; NULL for a non-agent.
    EXECUTE format($f$
CREATE OR REPLACE FUNCTION %1$I.memctl_agent_reads(role_name name) RETURNS text[]
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = %2$s AS $b$
DECLARE
    own text := %1$I.memctl_agent_of($1);
BEGIN
    IF own IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN coalesce((SELECT ARRAY[a.writes_namespace] || a.reads_namespaces FROM %1$I.agents a
                     WHERE a.role_name = $1 AND own <> ''), '{}');
END
$b$ $f$, s, pinned);

    -- The namespace the calling role writes, as memctl_agent_writer: '' (none) in the agent's own session.
    EXECUTE format($f$
CREATE OR REPLACE FUNCTION %1$I.memctl_agent_writes(role_name name) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = %2$s AS $b$
DECLARE
    own text := %1$I.memctl_agent_writer($1);
BEGIN
    IF own IS NULL OR own = '' THEN
        RETURN own;
    END IF;
    RETURN coalesce((SELECT a.writes_namespace FROM %1$I.agents a WHERE a.role_name = $1), '');
END
$b$ $f$, s, pinned);

    -- 0022's text index for an agent's role (docs/agents.md), now pinned and qualified.
    EXECUTE format($f$
CREATE OR REPLACE FUNCTION %1$I.memctl_agent_matches(q tsquery) RETURNS bigint[]
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = %2$s AS $b$
DECLARE
    own text := (SELECT a.name FROM %1$I.agents a WHERE a.role_name = %3$s);
    ids bigint[];
BEGIN
    IF own IS NULL THEN
        RETURN '{}';
    END IF;
    EXECUTE 'SELECT ARRAY(SELECT e.id FROM %1$I.episodes e WHERE e.agent = $1 AND e.tsv @@ $2)' INTO ids USING own, q;
    RETURN ids;
END
$b$ $f$, s, pinned, caller);

    -- The write gate's fold key (memctl.write.repeats.secret_digest), for a session memctl opened only.
    EXECUTE format($f$
CREATE OR REPLACE FUNCTION %1$I.memctl_fold_key() RETURNS bytea
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = %2$s AS $b$
BEGIN
    IF NOT pg_catalog.pg_has_role(session_user, current_user, 'USAGE') THEN
        RAISE EXCEPTION 'the fold key is memctl''s: an agent''s own session writes nothing'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN (SELECT k.key FROM %1$I.fold_key k);
END
$b$ $f$, s, pinned);

    -- The blocked sources among those asked about (the write gate's check), never the whole list.
    EXECUTE format($f$
CREATE OR REPLACE FUNCTION %1$I.memctl_blocked(sources text[]) RETURNS TABLE (source text, reason text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = %2$s AS $b$
    SELECT b.source, b.reason FROM %1$I.blocked_sources b WHERE b.source = ANY(sources)
$b$ $f$, s, pinned);

    -- memctl's locks (memctl.db.locks): locks on tables only their owner may lock, taken for a session memctl
    -- opened. An agent's session could hold any advisory lock memctl took against everyone else.
    EXECUTE format('CREATE TABLE %I.memctl_lock_models ()', s);
    EXECUTE format('CREATE TABLE %I.memctl_lock_sources ()', s);
    EXECUTE format('CREATE TABLE %I.memctl_lock_keys (key bigint PRIMARY KEY)', s);
    EXECUTE format('REVOKE ALL ON %1$I.memctl_lock_models, %1$I.memctl_lock_sources, %1$I.memctl_lock_keys '
                   'FROM PUBLIC', s);
    EXECUTE format($f$
CREATE OR REPLACE FUNCTION %1$I.memctl_lock(what text, shared boolean) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = %2$s AS $b$
BEGIN
    IF NOT pg_catalog.pg_has_role(session_user, current_user, 'USAGE') THEN
        RAISE EXCEPTION 'memctl''s locks are memctl''s: an agent''s own session writes nothing'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- shared: ROW EXCLUSIVE (the writers: compatible with each other); exclusive: SHARE ROW EXCLUSIVE
    IF what = 'models' AND shared THEN
        LOCK TABLE %1$I.memctl_lock_models IN ROW EXCLUSIVE MODE;
    ELSIF what = 'models' THEN
        LOCK TABLE %1$I.memctl_lock_models IN SHARE ROW EXCLUSIVE MODE;
    ELSIF what = 'sources' AND shared THEN
        LOCK TABLE %1$I.memctl_lock_sources IN ROW EXCLUSIVE MODE;
    ELSIF what = 'sources' THEN
        LOCK TABLE %1$I.memctl_lock_sources IN SHARE ROW EXCLUSIVE MODE;
    ELSE
        RAISE EXCEPTION 'no memctl lock %%', what;
    END IF;
END
$b$ $f$, s, pinned);
    EXECUTE format($f$
CREATE OR REPLACE FUNCTION %1$I.memctl_lock_key(space integer, name text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = %2$s AS $b$
DECLARE
    k bigint := pg_catalog.hashtextextended(space::text || pg_catalog.chr(31) || name, 0);
BEGIN
    IF NOT pg_catalog.pg_has_role(session_user, current_user, 'USAGE') THEN
        RAISE EXCEPTION 'memctl''s locks are memctl''s: an agent''s own session writes nothing'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    INSERT INTO %1$I.memctl_lock_keys (key) VALUES (k) ON CONFLICT DO NOTHING;
    PERFORM FROM %1$I.memctl_lock_keys l WHERE l.key = k FOR UPDATE;
END
$b$ $f$, s, pinned);

    -- Row-level security and memctl's policies on one memory table (0019's, now with the write checks above).
    EXECUTE format($f$
CREATE OR REPLACE FUNCTION %1$I.memctl_protect(tbl regclass) RETURNS boolean
LANGUAGE plpgsql SET search_path = %2$s AS $b$
DECLARE
    own text := format('(SELECT %%I.memctl_agent_of(current_user))', %1$L);
    writer text := format('(SELECT %%I.memctl_agent_writer(current_user))', %1$L);
    reads text := format('(SELECT %%I.memctl_agent_reads(current_user))', %1$L);
    writes text := format('(SELECT %%I.memctl_agent_writes(current_user))', %1$L);
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
        RETURN false;
    END IF;
    EXECUTE format('ALTER TABLE %%s ENABLE ROW LEVEL SECURITY', tbl);
    IF EXISTS (SELECT FROM pg_catalog.pg_attribute WHERE attrelid = tbl AND attname = 'agent' AND NOT attisdropped) THEN
        EXECUTE format('DROP POLICY IF EXISTS memctl_agent ON %%s', tbl);
        EXECUTE format('CREATE POLICY memctl_agent ON %%s USING (agent = coalesce(%%s, agent) AND agent <> '''') '
                       'WITH CHECK (agent = coalesce(%%s, agent) AND agent <> '''')', tbl, own, writer);
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.pg_attribute WHERE attrelid = tbl AND attname = 'namespace'
               AND NOT attisdropped) THEN
        EXECUTE format('DROP POLICY IF EXISTS memctl_read ON %%s', tbl);
        EXECUTE format('DROP POLICY IF EXISTS memctl_insert ON %%s', tbl);
        EXECUTE format('DROP POLICY IF EXISTS memctl_update ON %%s', tbl);
        EXECUTE format('DROP POLICY IF EXISTS memctl_delete ON %%s', tbl);
        EXECUTE format('CREATE POLICY memctl_read ON %%s FOR SELECT '
                       'USING (namespace = ANY (coalesce(%%s, ARRAY[namespace])))', tbl, reads);
        EXECUTE format('CREATE POLICY memctl_insert ON %%s FOR INSERT '
                       'WITH CHECK (namespace = coalesce(%%s, namespace) AND namespace <> '''')', tbl, writes);
        EXECUTE format('CREATE POLICY memctl_update ON %%s FOR UPDATE '
                       'USING (namespace = coalesce(%%s, namespace) AND namespace <> '''') '
                       'WITH CHECK (namespace = coalesce(%%s, namespace) AND namespace <> '''')', tbl, writes, writes);
        EXECUTE format('CREATE POLICY memctl_delete ON %%s FOR DELETE '
                       'USING (namespace = coalesce(%%s, namespace) AND namespace <> '''')', tbl, writes);
    END IF;
    RETURN true;
END
$b$ $f$, s, pinned);

    -- The agents' groups' grants on one memory table, made when the groups exist (false when they do not):
    -- SELECT to memctl_agents; INSERT and UPDATE of every column to memctl_agents_write, never on the table as a
    -- whole (that would let LOCK TABLE take it from every reader); USAGE on its identity sequences.
    EXECUTE format($f$
CREATE OR REPLACE FUNCTION %1$I.memctl_grant(tbl regclass) RETURNS boolean
LANGUAGE plpgsql SET search_path = %2$s AS $b$
DECLARE
    columns text;
    seq record;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'memctl_agents') THEN
        RETURN false;
    END IF;
    EXECUTE format('GRANT SELECT ON %%s TO memctl_agents', tbl);
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'memctl_agents_write') THEN
        RETURN true;
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) x
               JOIN pg_catalog.pg_roles r ON r.oid = x.grantee
               WHERE c.oid = tbl AND r.rolname = 'memctl_agents_write' AND x.privilege_type IN ('INSERT', 'UPDATE')) THEN
        EXECUTE format('REVOKE INSERT, UPDATE ON %%s FROM memctl_agents_write', tbl);
    END IF;
    SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum) INTO columns FROM pg_catalog.pg_attribute a
    WHERE a.attrelid = tbl AND a.attnum > 0 AND NOT a.attisdropped;
    EXECUTE format('GRANT INSERT (%%s), UPDATE (%%s) ON %%s TO memctl_agents_write', columns, columns, tbl);
    FOR seq IN SELECT d.objid::regclass AS rel FROM pg_catalog.pg_depend d
               JOIN pg_catalog.pg_class c ON c.oid = d.objid AND c.relkind = 'S'
               WHERE d.refobjid = tbl AND d.deptype IN ('a', 'i') LOOP
        EXECUTE format('GRANT USAGE ON SEQUENCE %%s TO memctl_agents_write', seq.rel);
    END LOOP;
    RETURN true;
END
$b$ $f$, s, pinned);

    -- Every grant the agents' groups have, made again: on every memory table (memctl_grant), on the functions
    -- policies and the write gate call, and nothing of memctl's for PUBLIC. Run by this file, by `agent add`, at
    -- every agent server's start and after a restore (pg_restore --no-acl drops every grant): memctl.db.wall.grant.
    EXECUTE format($f$
CREATE OR REPLACE FUNCTION %1$I.memctl_grant_all() RETURNS boolean
LANGUAGE plpgsql SET search_path = %2$s AS $b$
DECLARE
    r record;
    policies text := 'memctl_agent_of(name), memctl_agent_writer(name), memctl_agent_reads(name), '
                     'memctl_agent_writes(name), memctl_fold_key(), memctl_blocked(text[]), memctl_lock(text, boolean), '
                     'memctl_lock_key(integer, text)';
BEGIN
    FOR r IN SELECT p.oid::regprocedure AS fn FROM pg_catalog.pg_proc p
             WHERE p.pronamespace = %1$L::regnamespace AND p.proname LIKE 'memctl\_%%'
               AND NOT EXISTS (SELECT FROM pg_catalog.pg_depend d WHERE d.classid = 'pg_catalog.pg_proc'::regclass
                               AND d.objid = p.oid AND d.deptype = 'e') LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %%s FROM PUBLIC', r.fn);
    END LOOP;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'memctl_agents') THEN
        RETURN false;
    END IF;
    FOR r IN SELECT c.oid FROM pg_catalog.pg_class c
             WHERE c.relnamespace = %1$L::regnamespace AND c.relkind IN ('r', 'p') AND c.relname <> 'agents'
               AND EXISTS (SELECT FROM pg_catalog.pg_attribute a WHERE a.attrelid = c.oid
                           AND a.attname IN ('agent', 'namespace') AND NOT a.attisdropped) LOOP
        PERFORM %1$I.memctl_grant(r.oid);
    END LOOP;
    GRANT USAGE ON SCHEMA %1$I TO memctl_agents;
    GRANT SELECT ON %1$I.embedding_models TO memctl_agents;  -- search reads the active model
    REVOKE SELECT ON %1$I.blocked_sources FROM memctl_agents;  -- memctl_blocked() answers the gate's question
    EXECUTE 'GRANT EXECUTE ON FUNCTION ' || policies || ', memctl_agent_matches(tsquery) TO memctl_agents';
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'memctl_agents_write') THEN
        EXECUTE 'GRANT EXECUTE ON FUNCTION ' || policies || ' TO memctl_agents_write';
    END IF;
    RETURN true;
END
$b$ $f$, s, format('%I, pg_catalog, pg_temp', s));
END
$wall$;

ALTER TABLE agents ADD COLUMN login_at timestamptz;  -- when `agent add --login` / `agent login` last gave a password

-- Every memory table there is now: the new policies.
SELECT memctl_protect(c.oid)
FROM pg_class c
WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p') AND c.relname <> 'agents'
  AND EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname IN ('agent', 'namespace')
              AND NOT a.attisdropped);

SELECT memctl_grant_all();
