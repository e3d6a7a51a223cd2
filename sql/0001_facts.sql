-- Facts (semantic memory): one row per (namespace, key) holds what is true now;
-- fact_history keeps every change. An erasure nulls the values in history and
-- leaves a row saying that it happened.
CREATE EXTENSION IF NOT EXISTS vector;

CREATE TABLE facts (
    namespace  text        NOT NULL DEFAULT 'default',
    key        text        NOT NULL CHECK (length(key) BETWEEN 1 AND 255),
    value      text        NOT NULL,
    source     text,
    version    integer     NOT NULL CHECK (version > 0),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, key)
);
CREATE INDEX facts_source_idx ON facts (source);

CREATE TABLE fact_history (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    namespace  text        NOT NULL,
    key        text        NOT NULL,
    version    integer     NOT NULL,
    op         text        NOT NULL CHECK (op IN ('set', 'delete', 'erase')),
    old_value  text,
    new_value  text,
    source     text,
    changed_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX fact_history_key_idx ON fact_history (namespace, key, version);
