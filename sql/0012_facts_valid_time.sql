-- Facts in two timelines (docs/facts.md). Every version keeps when memctl recorded
-- it (fact_history.changed_at: system time) and when it became true (valid_from:
-- valid time). A value cannot become true after memctl recorded it: memctl keeps
-- what is or was true, not scheduled values; so the current value is the version
-- with the greatest valid_from. Versions recorded before this file became true when
-- they were recorded.
ALTER TABLE fact_history ADD COLUMN valid_from timestamptz;
UPDATE fact_history SET valid_from = changed_at;
ALTER TABLE fact_history
    ALTER COLUMN valid_from SET DEFAULT now(),
    ALTER COLUMN valid_from SET NOT NULL,
    ADD CONSTRAINT fact_history_valid_before_recorded CHECK (valid_from <= changed_at);

-- The current row's valid time: its version's, else (a row without one) its updated_at.
ALTER TABLE facts ADD COLUMN valid_from timestamptz;
UPDATE facts f SET valid_from = coalesce(
    (SELECT h.valid_from FROM fact_history h
     WHERE h.namespace = f.namespace AND h.key = f.key AND h.version = f.version AND h.op = 'set'
     ORDER BY h.id DESC LIMIT 1),
    f.updated_at);
ALTER TABLE facts
    ALTER COLUMN valid_from SET DEFAULT now(),
    ALTER COLUMN valid_from SET NOT NULL;
