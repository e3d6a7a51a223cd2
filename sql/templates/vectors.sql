-- The vectors of one embedding model, created by memctl when a model is
-- registered. Placeholders are filled with psycopg.sql: {table} and {fk} are
-- identifiers, {type} is vector or halfvec, {dims} a literal. content_hash is
-- the chunk text's sha256: identical text is embedded once and copied.
CREATE TABLE {table} (
    agent     text   NOT NULL,
    chunk_id  bigint NOT NULL,
    content_hash bytea NOT NULL,
    embedding {type}({dims}) NOT NULL,
    PRIMARY KEY (agent, chunk_id),
    CONSTRAINT {fk} FOREIGN KEY (agent, chunk_id) REFERENCES chunks (agent, id) ON DELETE CASCADE
);
CREATE INDEX {hash_index} ON {table} (content_hash)
