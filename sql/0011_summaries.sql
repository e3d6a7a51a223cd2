-- Summaries with lineage. A summary is an episode (kind 'summary', source
-- 'summarize:<model>'); this table records which episodes it was built from.
-- There is deliberately no foreign key to the source episode: prune deletes
-- sources after they are summarized, and the lineage must outlive them (the
-- source's created_at and content hash stay provable). Deleting the summary
-- (prune of kind summary, purge of a source it was built from) removes its rows.
CREATE TABLE summary_sources (
    agent             text        NOT NULL,
    summary_id        bigint      NOT NULL,
    source_id         bigint      NOT NULL,
    source_created_at timestamptz NOT NULL,
    source_hash       bytea       NOT NULL,   -- sha256 of the source episode's content (episodes.content_hash)
    PRIMARY KEY (agent, summary_id, source_id),
    FOREIGN KEY (agent, summary_id) REFERENCES episodes (agent, id) ON DELETE CASCADE
);
-- prune and summarize ask "is this episode a source of some summary?" per episode.
CREATE INDEX summary_sources_source_idx ON summary_sources (agent, source_id);
-- Failed windows are recorded in the job log (jobs.detail of job 'summarize'),
-- not here: a window without a summary is simply tried again by the next run.
