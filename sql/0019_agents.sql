-- Agents as principals (docs/agents.md, memctl.records.agents). A registered agent has a PostgreSQL role
-- of its own (NOLOGIN; memctl's servers assume it with SET ROLE) and at most one bearer token, kept here
-- only as its sha256. Row-level security on every memory table (every table with an `agent` or a
-- `namespace` column, this registry aside) keeps an agent's role to its own episodes and its own
-- namespace, plus the namespaces it may read; the owner (who migrates and runs the operator's commands)
-- is not subject to it: a table's owner bypasses its policies unless FORCE is set, and memctl never sets it.
--
-- Who is an agent is asked by SECURITY DEFINER functions (an agent's role cannot read this table, which
-- holds token hashes): the agent a role stands for, '' for a role of the memctl_agents group that is
-- registered in another database on the same server (it sees nothing here), NULL for any other role
-- (policies leave it to its grants, as before this file: `agent = coalesce(NULL, agent)` holds for every row,
-- as agent and namespace are NOT NULL). Policies call them as (SELECT f(current_user)), which PostgreSQL
-- evaluates once per statement (an InitPlan), not once per row.
CREATE TABLE agents (
    name              text        PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 200),
    role_name         text        NOT NULL UNIQUE,
    writes_namespace  text        NOT NULL,
    reads_namespaces  text[]      NOT NULL DEFAULT '{}',
    read_only         boolean     NOT NULL DEFAULT false,
    created_at        timestamptz NOT NULL DEFAULT now(),
    token_sha256      bytea       UNIQUE,
    token_issued_at   timestamptz
);

CREATE OR REPLACE FUNCTION memctl_agent_of(role_name name) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN  -- plpgsql, not sql: its statements' plans are kept for the session, not made again per statement
    RETURN coalesce(
        (SELECT a.name FROM agents a WHERE a.role_name = $1),
        (SELECT '' FROM pg_catalog.pg_auth_members m
         JOIN pg_catalog.pg_roles g ON g.oid = m.roleid
         JOIN pg_catalog.pg_roles u ON u.oid = m.member
         WHERE g.rolname = 'memctl_agents' AND u.rolname = $1 LIMIT 1));
END
$$;

-- The namespaces a role reads (its own first), '{}' for another database's agent, NULL for a non-agent.
CREATE OR REPLACE FUNCTION memctl_agent_reads(role_name name) RETURNS text[]
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    IF memctl_agent_of($1) IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN coalesce((SELECT ARRAY[a.writes_namespace] || a.reads_namespaces FROM agents a WHERE a.role_name = $1),
                    '{}');
END
$$;

-- The namespace a role writes: '' (none) for another database's agent, NULL for a non-agent.
CREATE OR REPLACE FUNCTION memctl_agent_writes(role_name name) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    IF memctl_agent_of($1) IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN coalesce((SELECT a.writes_namespace FROM agents a WHERE a.role_name = $1), '');
END
$$;

-- Row-level security and memctl's policies on one memory table; also run for each model's vector table
-- when it is created (memctl.embedding.models.register). Idempotent. On Citus nothing is done (false):
-- agents are refused there (docs/agents.md).
CREATE OR REPLACE FUNCTION memctl_protect(tbl regclass) RETURNS boolean
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    own text := '(SELECT memctl_agent_of(current_user))';
    reads text := '(SELECT memctl_agent_reads(current_user))';
    writes text := '(SELECT memctl_agent_writes(current_user))';
BEGIN
    IF EXISTS (SELECT FROM pg_extension WHERE extname = 'citus') THEN
        RETURN false;
    END IF;
    EXECUTE format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', tbl);
    IF EXISTS (SELECT FROM pg_attribute WHERE attrelid = tbl AND attname = 'agent' AND NOT attisdropped) THEN
        EXECUTE format('DROP POLICY IF EXISTS memctl_agent ON %s', tbl);
        EXECUTE format('CREATE POLICY memctl_agent ON %s USING (agent = coalesce(%s, agent)) '
                       'WITH CHECK (agent = coalesce(%s, agent))', tbl, own, own);
    END IF;
    IF EXISTS (SELECT FROM pg_attribute WHERE attrelid = tbl AND attname = 'namespace' AND NOT attisdropped) THEN
        EXECUTE format('DROP POLICY IF EXISTS memctl_read ON %s', tbl);
        EXECUTE format('DROP POLICY IF EXISTS memctl_insert ON %s', tbl);
        EXECUTE format('DROP POLICY IF EXISTS memctl_update ON %s', tbl);
        EXECUTE format('DROP POLICY IF EXISTS memctl_delete ON %s', tbl);
        EXECUTE format('CREATE POLICY memctl_read ON %s FOR SELECT '
                       'USING (namespace = ANY (coalesce(%s, ARRAY[namespace])))', tbl, reads);
        EXECUTE format('CREATE POLICY memctl_insert ON %s FOR INSERT WITH CHECK (namespace = coalesce(%s, namespace))',
                       tbl, writes);
        EXECUTE format('CREATE POLICY memctl_update ON %s FOR UPDATE USING (namespace = coalesce(%s, namespace)) '
                       'WITH CHECK (namespace = coalesce(%s, namespace))', tbl, writes, writes);
        EXECUTE format('CREATE POLICY memctl_delete ON %s FOR DELETE USING (namespace = coalesce(%s, namespace))',
                       tbl, writes);
    END IF;
    RETURN true;
END
$$;

-- Every memory table there is now: the catalog's, not a list (vector tables of every model included).
SELECT memctl_protect(c.oid)
FROM pg_class c
WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p') AND c.relname <> 'agents'
  AND EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname IN ('agent', 'namespace')
              AND NOT a.attisdropped);
