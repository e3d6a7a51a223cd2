-- Fix-up of 0019_agents.sql as committed on the agents branch before its merge: df4f8cc (functions in SQL,
-- policies written `f() IS NULL OR ...`) and 8c4fc07 (the released functions and policies, but CREATE FUNCTION
-- without OR REPLACE). The released file runs again over the registry's rows, which are kept: its functions
-- replace the earlier ones and memctl_protect rewrites every memory table's policies.
-- memctl:fixes 0019_agents.sql 86396aeaad711cc2d3c8dbf935485425fb017cc5d5a4df44ff67af48f7d8747b
-- memctl:fixes 0019_agents.sql 38bfd7c7b6dd980a6c90b93378339c6629f7242ccea4ba9311201fe3f8ac13f1
CREATE TEMPORARY TABLE memctl_fixup_agents ON COMMIT DROP AS SELECT * FROM agents;
DROP TABLE agents;
-- memctl:released
INSERT INTO agents SELECT * FROM memctl_fixup_agents;
