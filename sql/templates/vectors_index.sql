-- HNSW index over one model's vectors (cosine). {index} and {table} are
-- identifiers; {ops} is vector_cosine_ops or halfvec_cosine_ops.
CREATE INDEX {concurrently} {index} ON {table} USING hnsw (embedding {ops})
