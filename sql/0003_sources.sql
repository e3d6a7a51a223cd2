-- Blocked sources: writes (episodes, facts) whose source is listed here are
-- refused, for the day a web page or a ticket turns out to have written
-- instructions into memory.
CREATE TABLE blocked_sources (
    source     text        PRIMARY KEY,
    reason     text,
    blocked_at timestamptz NOT NULL DEFAULT now()
);
