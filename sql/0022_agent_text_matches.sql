-- The text index for an agent's role (docs/agents.md "The text index under row-level security").
-- Under row-level security PostgreSQL evaluates a table's policy before any condition whose operator
-- is not LEAKPROOF, and `tsvector @@ tsquery` is not: in an agent's role the GIN index on episodes.tsv
-- cannot find rows, and every word of a query is tested on each of the agent's episodes (a count of
-- ten rare words: ten scans of the agent's episodes). This function runs that index scan with its
-- owner's rights, restricted to the episodes of the agent the calling role stands for, read from the
-- registry, never from an argument; it returns their ids only (an array: `e.id = ANY(...)` is an index
-- condition under row-level security, as int8 equality is LEAKPROOF), with which memctl's statements read
-- episodes again, where the policies filter every row.
-- The calling role: the one SET ROLE assumed (the `role` setting), or the session's own when none was
-- (a role that logs in). Inside a SECURITY DEFINER function current_user is the function's owner.
-- A role that is not an agent registered here gets '{}' (the owner reads episodes directly).
CREATE OR REPLACE FUNCTION memctl_agent_matches(q tsquery) RETURNS bigint[]
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    caller name := CASE WHEN current_setting('role') = 'none' THEN session_user ELSE current_setting('role') END;
    own text := (SELECT a.name FROM agents a WHERE a.role_name = caller);
    ids bigint[];
BEGIN
    IF own IS NULL THEN
        RETURN '{}';
    END IF;
    -- planned for this query's words (EXECUTE ... USING): for words in most of the agent's episodes the
    -- agent's index and a test of each is cheaper than the text index, as the owner's plan finds
    EXECUTE 'SELECT ARRAY(SELECT e.id FROM episodes e WHERE e.agent = $1 AND e.tsv @@ $2)' INTO ids USING own, q;
    RETURN ids;
END
$$;

REVOKE ALL ON FUNCTION memctl_agent_matches(tsquery) FROM PUBLIC;
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'memctl_agents') THEN
        GRANT EXECUTE ON FUNCTION memctl_agent_matches(tsquery) TO memctl_agents;
    END IF;
END
$$;
