-- Episode access (the "last accessed" of the Generative Agents memory stream):
-- when recall or search last returned an episode, and how often. A table of
-- its own, so that a read writes one small row per returned episode instead
-- of a new version of the episode row (content and all) in a large table.
-- Search may weigh recency from last access instead of creation
-- ([search] recency_from = "accessed").
CREATE TABLE episode_access (
    agent            text        NOT NULL,
    episode_id       bigint      NOT NULL,
    last_accessed_at timestamptz NOT NULL DEFAULT now(),
    access_count     bigint      NOT NULL DEFAULT 1 CHECK (access_count > 0),
    PRIMARY KEY (agent, episode_id),
    FOREIGN KEY (agent, episode_id) REFERENCES episodes (agent, id) ON DELETE CASCADE
);
-- search looks access up by episode id alone (ids are unique in practice).
CREATE INDEX episode_access_episode_idx ON episode_access (episode_id);
