-- cuectl on PostgreSQL with one role per user: roles and row-level security.
--
-- Run once per database, as the owner of the cuectl tables (the role that ran
-- `cuectl admin migrate`), after the schema exists:  cuectl admin pg-roles | psql "$URL"
-- Then give each person a LOGIN role named like their account on the worker hosts
-- (a root worker runs a job as the OS user named by the role that submitted it) and
-- GRANT cuectl_user to it; GRANT cuectl_worker to the workers' role and cuectl_admin to
-- admins. The table owner bypasses these policies: use it for migrations only.
--
-- What holds afterwards (docs/security.md): anyone may read the queue; a user changes
-- only jobs and frames submitted by their own role; workers and admins change any;
-- nobody but the server sets jobs.submitted_by (a trigger of the schema itself).
DO $roles$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'cuectl_user') THEN CREATE ROLE cuectl_user NOLOGIN; END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'cuectl_worker') THEN CREATE ROLE cuectl_worker NOLOGIN; END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'cuectl_admin') THEN CREATE ROLE cuectl_admin NOLOGIN; END IF;
END $roles$;

GRANT SELECT, INSERT, UPDATE, DELETE ON jobs, layers, layer_deps, frames, frame_deps, hosts, attempts, samples
    TO cuectl_user, cuectl_worker, cuectl_admin;
-- API tokens: admins manage them. `cuectl serve` reads them: grant its login role
-- cuectl_admin (or at least SELECT, UPDATE here) and each API user's role (docs/api.md).
GRANT SELECT, INSERT, UPDATE ON tokens TO cuectl_admin;
GRANT SELECT ON meta TO cuectl_user, cuectl_worker, cuectl_admin;
DO $grant$
BEGIN
    EXECUTE format('GRANT USAGE ON ALL SEQUENCES IN SCHEMA %I TO cuectl_user, cuectl_worker, cuectl_admin',
                   current_schema());
END $grant$;

-- Who acts is current_user: the login role, or the role an API server switched to with
-- SET ROLE for a token's user (allowed only to members of that role: docs/api.md).
-- Workers and admins may change anything. The ownership checks run as the owner (SECURITY
-- DEFINER) so that they see every job whatever its policies; inside them current_user is
-- the owner, so the policies pass the caller in.
-- Each function has a fixed search_path (pg_catalog, this schema, pg_temp last) and names
-- its tables with their schema: a caller's temporary table (pg_temp is searched first
-- unless it is named) or a same-named object elsewhere cannot stand in for ours. Running
-- this script again replaces the functions of older versions, which read jobs through the
-- caller's search_path (issue 35).
-- (Versions before schema 4 had one-argument checks on session_user: dropped with the
-- policies that used them, which are all created again below.)
DROP FUNCTION IF EXISTS cuectl_owns(bigint) CASCADE;
DROP FUNCTION IF EXISTS cuectl_owns_frame(bigint) CASCADE;
DROP FUNCTION IF EXISTS cuectl_owns_layer(bigint) CASCADE;
DO $functions$
DECLARE
    fixed text := format('SET search_path = pg_catalog, %I, pg_temp', current_schema());
    definer text := 'LANGUAGE sql STABLE SECURITY DEFINER ' || fixed;
    s text := quote_ident(current_schema());
BEGIN
    EXECUTE format($f$CREATE OR REPLACE FUNCTION %s.cuectl_privileged() RETURNS boolean LANGUAGE sql STABLE %s AS $b$
        SELECT pg_catalog.pg_has_role(current_user, 'cuectl_worker', 'MEMBER')
            OR pg_catalog.pg_has_role(current_user, 'cuectl_admin', 'MEMBER') $b$$f$, s, fixed);
    EXECUTE format($f$CREATE OR REPLACE FUNCTION %1$s.cuectl_owns(job bigint, who name) RETURNS boolean %2$s AS $b$
        SELECT EXISTS (SELECT 1 FROM %1$s.jobs WHERE id = job AND submitted_by = who) $b$$f$, s, definer);
    EXECUTE format($f$CREATE OR REPLACE FUNCTION %1$s.cuectl_owns_frame(frame bigint, who name) RETURNS boolean %2$s AS $b$
        SELECT EXISTS (SELECT 1 FROM %1$s.frames f JOIN %1$s.jobs j ON j.id = f.job_id
                       WHERE f.id = frame AND j.submitted_by = who) $b$$f$, s, definer);
    EXECUTE format($f$CREATE OR REPLACE FUNCTION %1$s.cuectl_owns_layer(layer bigint, who name) RETURNS boolean %2$s AS $b$
        SELECT EXISTS (SELECT 1 FROM %1$s.layers l JOIN %1$s.jobs j ON j.id = l.job_id
                       WHERE l.id = layer AND j.submitted_by = who) $b$$f$, s, definer);
    EXECUTE format($f$CREATE OR REPLACE FUNCTION %1$s.cuectl_owns_depend(depend bigint, who name) RETURNS boolean %2$s AS $b$
        SELECT EXISTS (SELECT 1 FROM %1$s.depends d JOIN %1$s.jobs j ON j.id = d.job_id
                       WHERE d.id = depend AND j.submitted_by = who) $b$$f$, s, definer);
    -- The job a layer, frame or dependency belongs to (NULL: none): policies compare it with
    -- the row's own job, so that no row of one job points into another's.
    EXECUTE format($f$CREATE OR REPLACE FUNCTION %1$s.cuectl_layer_job(layer bigint) RETURNS bigint %2$s AS $b$
        SELECT job_id FROM %1$s.layers WHERE id = layer $b$$f$, s, definer);
    EXECUTE format($f$CREATE OR REPLACE FUNCTION %1$s.cuectl_frame_job(frame bigint) RETURNS bigint %2$s AS $b$
        SELECT job_id FROM %1$s.frames WHERE id = frame $b$$f$, s, definer);
    EXECUTE format($f$CREATE OR REPLACE FUNCTION %1$s.cuectl_depend_job(depend bigint) RETURNS bigint %2$s AS $b$
        SELECT job_id FROM %1$s.depends WHERE id = depend $b$$f$, s, definer);
END $functions$;

ALTER TABLE jobs ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS cuectl_read ON jobs;
DROP POLICY IF EXISTS cuectl_submit ON jobs;
DROP POLICY IF EXISTS cuectl_change ON jobs;
DROP POLICY IF EXISTS cuectl_remove ON jobs;
CREATE POLICY cuectl_read ON jobs FOR SELECT USING (true);
CREATE POLICY cuectl_submit ON jobs FOR INSERT WITH CHECK (true);
CREATE POLICY cuectl_change ON jobs FOR UPDATE USING (submitted_by = current_user OR cuectl_privileged());
CREATE POLICY cuectl_remove ON jobs FOR DELETE USING (submitted_by = current_user OR cuectl_privileged());

ALTER TABLE layers ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS cuectl_read ON layers;
DROP POLICY IF EXISTS cuectl_submit ON layers;
DROP POLICY IF EXISTS cuectl_change ON layers;
DROP POLICY IF EXISTS cuectl_remove ON layers;
CREATE POLICY cuectl_read ON layers FOR SELECT USING (true);
CREATE POLICY cuectl_submit ON layers FOR INSERT WITH CHECK (cuectl_owns(job_id, current_user));
-- A layer's command never changes after submit; workers update its dependency count.
CREATE POLICY cuectl_change ON layers FOR UPDATE USING (cuectl_privileged() OR cuectl_owns(job_id, current_user));
CREATE POLICY cuectl_remove ON layers FOR DELETE USING (cuectl_privileged() OR cuectl_owns(job_id, current_user));

ALTER TABLE frames ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS cuectl_read ON frames;
DROP POLICY IF EXISTS cuectl_submit ON frames;
DROP POLICY IF EXISTS cuectl_change ON frames;
DROP POLICY IF EXISTS cuectl_remove ON frames;
CREATE POLICY cuectl_read ON frames FOR SELECT USING (true);
-- A frame's layer belongs to the frame's job: else a user's frame numbers would run another
-- user's layer (its command, as its owner).
CREATE POLICY cuectl_submit ON frames FOR INSERT
    WITH CHECK (cuectl_owns(job_id, current_user) AND cuectl_layer_job(layer_id) = job_id);
CREATE POLICY cuectl_change ON frames FOR UPDATE USING (cuectl_privileged() OR cuectl_owns(job_id, current_user))
    WITH CHECK (cuectl_privileged() OR (cuectl_owns(job_id, current_user) AND cuectl_layer_job(layer_id) = job_id));
CREATE POLICY cuectl_remove ON frames FOR DELETE USING (cuectl_privileged() OR cuectl_owns(job_id, current_user));

ALTER TABLE frame_deps ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS cuectl_read ON frame_deps;
DROP POLICY IF EXISTS cuectl_write ON frame_deps;
CREATE POLICY cuectl_read ON frame_deps FOR SELECT USING (true);
CREATE POLICY cuectl_write ON frame_deps FOR ALL USING (cuectl_privileged() OR cuectl_owns_frame(frame_id, current_user))
    WITH CHECK (cuectl_privileged() OR (cuectl_owns_frame(frame_id, current_user)
                                        AND (depend_id IS NULL OR cuectl_depend_job(depend_id) = cuectl_frame_job(frame_id))));

ALTER TABLE layer_deps ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS cuectl_read ON layer_deps;
DROP POLICY IF EXISTS cuectl_write ON layer_deps;
CREATE POLICY cuectl_read ON layer_deps FOR SELECT USING (true);
CREATE POLICY cuectl_write ON layer_deps FOR ALL USING (cuectl_privileged() OR cuectl_owns_layer(layer_id, current_user))
    WITH CHECK (cuectl_privileged() OR (cuectl_owns_layer(layer_id, current_user)
                                        AND (depend_id IS NULL OR cuectl_depend_job(depend_id) = cuectl_layer_job(layer_id))));

-- What only workers and admins write (insert, update, delete): attempts, samples, hosts.
-- A job's owner neither changes nor deletes its accounting; pruning her finished job
-- removes them with its frames (the foreign key's cascade).
ALTER TABLE attempts ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS cuectl_read ON attempts;
DROP POLICY IF EXISTS cuectl_write ON attempts;
CREATE POLICY cuectl_read ON attempts FOR SELECT USING (true);
CREATE POLICY cuectl_write ON attempts FOR ALL USING (cuectl_privileged()) WITH CHECK (cuectl_privileged());

ALTER TABLE samples ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS cuectl_read ON samples;
DROP POLICY IF EXISTS cuectl_write ON samples;
CREATE POLICY cuectl_read ON samples FOR SELECT USING (true);
CREATE POLICY cuectl_write ON samples FOR ALL USING (cuectl_privileged()) WITH CHECK (cuectl_privileged());

ALTER TABLE hosts ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS cuectl_read ON hosts;
DROP POLICY IF EXISTS cuectl_write ON hosts;
CREATE POLICY cuectl_read ON hosts FOR SELECT USING (true);
CREATE POLICY cuectl_write ON hosts FOR ALL USING (cuectl_privileged()) WITH CHECK (cuectl_privileged());

-- Dependencies (schema 8, docs/opencue.md): everyone reads them. A user records and drops
-- dependencies of their own jobs only (a job waits on another user's, never the reverse);
-- releasing one when its target finishes changes the waiting job's rows, which workers and
-- admins may do for any job (a worker's sweep releases those a user's transaction could not).
GRANT SELECT, INSERT, UPDATE, DELETE ON depends, depend_edges TO cuectl_user, cuectl_worker, cuectl_admin;
ALTER TABLE depends ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS cuectl_read ON depends;
DROP POLICY IF EXISTS cuectl_write ON depends;
CREATE POLICY cuectl_read ON depends FOR SELECT USING (true);
-- The waiting layer or frame a dependency names belongs to its job, and so do its edges'.
CREATE POLICY cuectl_write ON depends FOR ALL USING (cuectl_privileged() OR cuectl_owns(job_id, current_user))
    WITH CHECK (cuectl_privileged() OR (cuectl_owns(job_id, current_user)
                                        AND (layer_id IS NULL OR cuectl_layer_job(layer_id) = job_id)
                                        AND (frame_id IS NULL OR cuectl_frame_job(frame_id) = job_id)));
ALTER TABLE depend_edges ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS cuectl_read ON depend_edges;
DROP POLICY IF EXISTS cuectl_write ON depend_edges;
CREATE POLICY cuectl_read ON depend_edges FOR SELECT USING (true);
CREATE POLICY cuectl_write ON depend_edges FOR ALL
    USING (cuectl_privileged() OR cuectl_owns_depend(depend_id, current_user))
    WITH CHECK (cuectl_privileged() OR (cuectl_owns_depend(depend_id, current_user)
                                        AND (layer_id IS NULL OR cuectl_layer_job(layer_id) = cuectl_depend_job(depend_id))
                                        AND (frame_id IS NULL OR cuectl_frame_job(frame_id) = cuectl_depend_job(depend_id))));

-- Named limits and quotas (schema 6): everyone reads them (claims and pending reasons
-- check them); only admins change them. Which limits a layer holds is written once, at
-- submit, by the layer's owner: nobody but a worker or an admin removes or changes a row,
-- so a user cannot slip out of a licence pool after submitting.
GRANT SELECT ON limits, quotas TO cuectl_user, cuectl_worker, cuectl_admin;
GRANT INSERT, UPDATE, DELETE ON limits, quotas TO cuectl_admin;
GRANT SELECT, INSERT, UPDATE, DELETE ON layer_limits TO cuectl_user, cuectl_worker, cuectl_admin;
ALTER TABLE layer_limits ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS cuectl_read ON layer_limits;
DROP POLICY IF EXISTS cuectl_submit ON layer_limits;
DROP POLICY IF EXISTS cuectl_change ON layer_limits;
DROP POLICY IF EXISTS cuectl_remove ON layer_limits;
CREATE POLICY cuectl_read ON layer_limits FOR SELECT USING (true);
CREATE POLICY cuectl_submit ON layer_limits FOR INSERT
    WITH CHECK (cuectl_privileged() OR cuectl_owns_layer(layer_id, current_user));
CREATE POLICY cuectl_change ON layer_limits FOR UPDATE USING (cuectl_privileged());
CREATE POLICY cuectl_remove ON layer_limits FOR DELETE USING (cuectl_privileged());

-- Notifications (schema 7, docs/notifications.md): everyone reads them. A row is written
-- in the transaction that finishes a job or kills a frame, which a job's owner can cause
-- (`frame kill`, `job kill`): owners insert rows for their own jobs, and re-arm them when
-- the job finishes again after a retry (an UPDATE of their own job's rows). Marking rows
-- claimed, delivered or failed is the deliverers' (workers, admins); nobody but them deletes
-- one (pruning a job removes its rows by the foreign key's cascade).
GRANT SELECT, INSERT, UPDATE, DELETE ON notifications TO cuectl_user, cuectl_worker, cuectl_admin;
ALTER TABLE notifications ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS cuectl_read ON notifications;
DROP POLICY IF EXISTS cuectl_submit ON notifications;
DROP POLICY IF EXISTS cuectl_change ON notifications;
DROP POLICY IF EXISTS cuectl_remove ON notifications;
CREATE POLICY cuectl_read ON notifications FOR SELECT USING (true);
-- A frame's row (frame_id 0: the job's) names a frame of the row's job.
CREATE POLICY cuectl_submit ON notifications FOR INSERT
    WITH CHECK (cuectl_privileged() OR (cuectl_owns(job_id, current_user)
                                        AND (frame_id = 0 OR cuectl_frame_job(frame_id) = job_id)));
CREATE POLICY cuectl_change ON notifications FOR UPDATE USING (cuectl_privileged() OR cuectl_owns(job_id, current_user))
    WITH CHECK (cuectl_privileged() OR (cuectl_owns(job_id, current_user)
                                        AND (frame_id = 0 OR cuectl_frame_job(frame_id) = job_id)));
CREATE POLICY cuectl_remove ON notifications FOR DELETE USING (cuectl_privileged());

-- The farm's notification defaults (key notify_defaults) and the store settings
-- (`cuectl admin setting`, e.g. depend.satisfy_on_eaten) live in meta: admins write those
-- keys and no other (schema_version is the table owner's, through migrations).
GRANT INSERT, UPDATE, DELETE ON meta TO cuectl_admin;
ALTER TABLE meta ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS cuectl_read ON meta;
DROP POLICY IF EXISTS cuectl_defaults ON meta;
CREATE POLICY cuectl_read ON meta FOR SELECT USING (true);
CREATE POLICY cuectl_defaults ON meta FOR ALL TO cuectl_admin
    USING (key IN ('notify_defaults', 'depend.satisfy_on_eaten'))
    WITH CHECK (key IN ('notify_defaults', 'depend.satisfy_on_eaten'));

-- Services (schema 8, `cuectl admin service`): everyone reads them (a submit applies the
-- defaults of its layers' services); only admins change them.
GRANT SELECT ON services TO cuectl_user, cuectl_worker, cuectl_admin;
GRANT INSERT, UPDATE, DELETE ON services TO cuectl_admin;
