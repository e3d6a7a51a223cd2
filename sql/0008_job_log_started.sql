-- The job log's retention: `prune` deletes jobs and runbook_runs rows started
-- before [retention] jobs (default 90d), in batches ordered by start time.
-- The embed timer alone writes about 105,000 job rows a year; these indexes
-- let each batch and the dry run's count find the old rows without a scan.
CREATE INDEX jobs_started_idx ON jobs (started_at, id);
CREATE INDEX runbook_runs_started_idx ON runbook_runs (started_at);
