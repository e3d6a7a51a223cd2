-- The key of the fold digest (memctl.records.repeats.secret_digest): when redaction changed an episode, its
-- fold key (episodes.norm_hash) also holds an HMAC of the text as it came, under this key, so that two different
-- secrets redacted to the same text stay two events without memory keeping anything from which a secret could
-- be guessed back by hashing guesses (a plain hash of "password: hunter2" could be). 256 random bits from
-- gen_random_uuid (pg_strong_random), made once per database; a backup keeps it, so a restore folds as before.
-- Readable by its owner only: no agent role reads it.
CREATE TABLE fold_key (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    key bytea   NOT NULL
);
INSERT INTO fold_key (key)
SELECT substr(uuid_send(gen_random_uuid()), 9) || substr(uuid_send(gen_random_uuid()), 9)
    || substr(uuid_send(gen_random_uuid()), 9) || substr(uuid_send(gen_random_uuid()), 9);
REVOKE ALL ON fold_key FROM PUBLIC;
