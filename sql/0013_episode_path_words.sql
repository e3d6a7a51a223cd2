-- Words inside paths, URLs, hosts and dotted names are words (docs/search.md). PostgreSQL's default
-- parser keeps '/var/log/nginx' one file token, 'example.com/a/b' a URL, 'db.host' a host, so a search
-- for nginx, example or host (or -nginx) did not see them. The text is now indexed with / . : @ read as
-- spaces: '/var/log/nginx' gives var, log, nginx in a row; the query side splits its words the same way
-- (memctl.reading.statement), so '/var/log/nginx' or '10.8.0.4' as a query is the phrase of its parts.
-- Text without those characters gets the same tsvector as before. The generated column is replaced
-- (PostgreSQL before 17 cannot change a generated expression in place): one rewrite of episodes and a
-- new GIN index, a few seconds per 100k episodes.
ALTER TABLE episodes DROP COLUMN tsv;
ALTER TABLE episodes ADD COLUMN tsv tsvector
    GENERATED ALWAYS AS (to_tsvector('english', translate(left(content, 100000), '/.:@', '    '))) STORED;
CREATE INDEX episodes_tsv_idx ON episodes USING gin (tsv);
