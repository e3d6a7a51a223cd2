-- A query that names a period (memctl.reading.when) also searches what was written in it, and the firsts
-- whose repeats were seen in it: created before the period, last seen (last_seen_at) inside or after its
-- start (memctl.reading.statement, PERIOD_EPISODES). This index finds those firsts; only firsts with
-- repeats have last_seen_at, so it is small. On Citus it is created on every shard.
CREATE INDEX episodes_last_seen_idx ON episodes (last_seen_at) WHERE last_seen_at IS NOT NULL;
