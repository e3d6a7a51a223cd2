-- A job stopped from outside is neither a failure nor a completion: 'interrupted' is a run ended by SIGINT or
-- SIGTERM (`systemctl stop`, Ctrl-C) or whose output's reader went away (`memctl export | head -1`). What it had
-- committed stays; what was in flight rolled back. Alerts count failed and unavailable runs only.
ALTER TABLE jobs DROP CONSTRAINT IF EXISTS jobs_outcome_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_outcome_check
    CHECK (outcome IN ('running', 'ok', 'partial', 'failed', 'unavailable', 'interrupted'));
