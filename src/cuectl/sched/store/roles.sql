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

-- Notifications (schema 7, docs/notifications.md): everyone reads them; only workers and
-- admins write rows (insert, claim, mark delivered or failed, delete). A row is written in the
-- transaction that finishes a job or kills a frame, which a job's owner can cause (`job kill`,
-- `frame kill`): her store calls cuectl_record_notification for it, which writes the row as
-- the tables' owner only when (a) this very transaction made the event happen (the job or
-- frame row was changed by it: its xmin), (b) the job's state is that event, and (c) the
-- target, as canonical JSON, is one of the job's `notify` entries or the farm defaults asking
-- for that event. So an owner can no longer write a row naming any target she likes (a
-- command run by a root deliverer, any mail address), mark her rows delivered or claimed, or
-- re-arm a delivered one without a new event; nobody can record or re-arm another user's. The
-- table grants stay, as for attempts: the policies refuse (a user's UPDATE or DELETE changes
-- no row, her INSERT is an error). Pruning a job removes its rows by the foreign key's cascade.
-- Every function has the fixed search_path and schema-qualified names of the checks above.
DO $notify_functions$
DECLARE
    fixed text := format('SET search_path = pg_catalog, %I, pg_temp', current_schema());
    s text := quote_ident(current_schema());
BEGIN
    -- A JSON string exactly as Python's json.dumps writes it (ensure_ascii: \uXXXX for what
    -- is not printable ASCII, surrogate pairs beyond U+FFFF), so that the target text made
    -- here is the one sched/notify.py's target_json makes: the row's unique key.
    EXECUTE format($f$CREATE OR REPLACE FUNCTION %1$s.cuectl_json_string(value text) RETURNS text
        LANGUAGE sql IMMUTABLE STRICT %2$s AS $b$
        SELECT '"' || COALESCE(string_agg(CASE
                WHEN c = '"' THEN '\"' WHEN c = '\' THEN '\\'
                WHEN c = chr(10) THEN '\n' WHEN c = chr(13) THEN '\r' WHEN c = chr(9) THEN '\t'
                WHEN c = chr(8) THEN '\b' WHEN c = chr(12) THEN '\f'
                WHEN ascii(c) BETWEEN 32 AND 126 THEN c
                WHEN ascii(c) < 65536 THEN '\u' || lpad(to_hex(ascii(c)), 4, '0')
                ELSE '\u' || to_hex(55296 + ((ascii(c) - 65536) >> 10))
                     || '\u' || to_hex(56320 + ((ascii(c) - 65536) & 1023)) END, '' ORDER BY i), '') || '"'
        FROM pg_catalog.generate_series(1, length(value)) AS i, LATERAL substr(value, i, 1) AS c $b$$f$, s, fixed);
    EXECUTE format($f$CREATE OR REPLACE FUNCTION %1$s.cuectl_notify_target(kind text, target text) RETURNS text
        LANGUAGE sql IMMUTABLE STRICT %2$s AS $b$
        SELECT '{"kind":' || %1$s.cuectl_json_string(kind) || ',"target":' || %1$s.cuectl_json_string(target) || '}'
        $b$$f$, s, fixed);
    -- Does a list of notify entries (JSON text: a job's `notify`, the farm defaults) hold
    -- {kind: target} for event (`on` absent: finished and failed)? Text that is not such a
    -- list (a hand-edited store) holds nothing, and is no error.
    EXECUTE format($f$CREATE OR REPLACE FUNCTION %1$s.cuectl_notify_asks(entries text, kind text, target text,
                                                                    event text) RETURNS boolean
        LANGUAGE plpgsql IMMUTABLE %2$s AS $b$
        DECLARE
            items jsonb;
        BEGIN
            BEGIN
                items := entries::jsonb;
            EXCEPTION WHEN others THEN
                RETURN false;
            END;
            IF items IS NULL OR jsonb_typeof(items) <> 'array' THEN
                RETURN false;
            END IF;
            RETURN EXISTS (SELECT 1 FROM jsonb_array_elements(items) AS e(item)
                           WHERE jsonb_typeof(e.item) = 'object' AND jsonb_typeof(e.item -> kind) = 'string'
                             AND e.item ->> kind = target
                             AND CASE WHEN e.item -> 'on' IS NULL OR e.item -> 'on' = 'null'::jsonb
                                          THEN event IN ('finished', 'failed')
                                      WHEN jsonb_typeof(e.item -> 'on') = 'array'
                                          THEN e.item -> 'on' @> jsonb_build_array(event)
                                      ELSE e.item -> 'on' = to_jsonb(event) END);
        END $b$$f$, s, fixed);
    -- Record (or re-arm, when at is later than the row's created_at) one notification row;
    -- false, writing nothing, unless (a), (b) and (c) above hold. Whoever calls it can write
    -- only the row the event's own transaction would write: the caller's role is not needed
    -- (a SECURITY DEFINER function cannot see it), since only the job's owner, workers and
    -- admins can change the job's or frame's row in their transaction. The store never uses
    -- savepoints, so the rows it changed carry the transaction's own id.
    EXECUTE format($f$CREATE OR REPLACE FUNCTION %1$s.cuectl_record_notification(
            in_job bigint, in_event text, in_frame bigint, in_target text, in_at double precision) RETURNS boolean
        LANGUAGE plpgsql VOLATILE SECURITY DEFINER %2$s AS $b$
        DECLARE
            parsed jsonb;
            kind text;
            value text;
            me xid := pg_current_xact_id()::xid;
            happened boolean;
        BEGIN
            BEGIN
                parsed := in_target::jsonb;
            EXCEPTION WHEN others THEN
                RETURN false;
            END;
            IF NOT coalesce(jsonb_typeof(parsed) = 'object' AND jsonb_typeof(parsed -> 'kind') = 'string'
                            AND jsonb_typeof(parsed -> 'target') = 'string', false) THEN
                RETURN false;
            END IF;
            kind := parsed ->> 'kind';
            value := parsed ->> 'target';
            IF NOT coalesce(kind IN ('command', 'webhook', 'email')
                            AND in_target = %1$s.cuectl_notify_target(kind, value), false) THEN
                RETURN false;
            END IF;
            IF in_event IN ('finished', 'failed') THEN
                SELECT in_frame = 0 AND j.state = 'FINISHED' AND j.xmin = me
                       AND in_event = CASE WHEN j.killed_at IS NOT NULL OR EXISTS (
                               SELECT 1 FROM %1$s.frames f WHERE f.job_id = j.id AND f.state = 'DEAD')
                           THEN 'failed' ELSE 'finished' END
                  INTO happened FROM %1$s.jobs j WHERE j.id = in_job;
            ELSIF in_event = 'dead' THEN
                SELECT f.state = 'DEAD' AND f.xmin = me INTO happened
                  FROM %1$s.frames f WHERE f.id = in_frame AND f.job_id = in_job;
            END IF;
            IF NOT coalesce(happened, false) THEN
                RETURN false;
            END IF;
            IF NOT (%1$s.cuectl_notify_asks((SELECT j.notify FROM %1$s.jobs j WHERE j.id = in_job), kind, value,
                                            in_event)
                     OR %1$s.cuectl_notify_asks((SELECT m.value FROM %1$s.meta m WHERE m.key = 'notify_defaults'),
                                               kind, value, in_event)) THEN
                RETURN false;
            END IF;
            INSERT INTO %1$s.notifications AS n (job_id, event, frame_id, target, created_at, attempts, next_at)
                VALUES (in_job, in_event, in_frame, in_target, in_at, 0, in_at)
                ON CONFLICT (job_id, event, frame_id, target) DO UPDATE SET
                    created_at = excluded.created_at, attempts = 0, next_at = excluded.next_at, claimed_by = NULL,
                    claimed_until = NULL, delivered_at = NULL, error = NULL
                WHERE n.created_at < excluded.created_at;
            RETURN true;
        END $b$$f$, s, fixed);
    EXECUTE format('REVOKE ALL ON FUNCTION %s.cuectl_record_notification(bigint, text, bigint, text, '
                   'double precision) FROM PUBLIC', s);
    EXECUTE format('GRANT EXECUTE ON FUNCTION %s.cuectl_record_notification(bigint, text, bigint, text, '
                   'double precision) TO cuectl_user, cuectl_worker, cuectl_admin', s);
END $notify_functions$;

GRANT SELECT, INSERT, UPDATE, DELETE ON notifications TO cuectl_user, cuectl_worker, cuectl_admin;
ALTER TABLE notifications ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS cuectl_read ON notifications;
DROP POLICY IF EXISTS cuectl_submit ON notifications;
DROP POLICY IF EXISTS cuectl_change ON notifications;
DROP POLICY IF EXISTS cuectl_remove ON notifications;
DROP POLICY IF EXISTS cuectl_write ON notifications;
CREATE POLICY cuectl_read ON notifications FOR SELECT USING (true);
-- A frame's row (frame_id 0: the job's) names a frame of the row's job.
CREATE POLICY cuectl_write ON notifications FOR ALL USING (cuectl_privileged())
    WITH CHECK (cuectl_privileged() AND (frame_id = 0 OR cuectl_frame_job(frame_id) = job_id));

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

-- GPU events and device states (schema 12, docs/gpu-health.md): everyone reads them (a
-- user sees why her frame was flagged, why a device is out of service); workers record
-- what they see on their devices and drain sick ones, admins drain and undrain by hand.
GRANT SELECT ON gpu_events, device_states TO cuectl_user, cuectl_worker, cuectl_admin;
GRANT INSERT, UPDATE, DELETE ON gpu_events, device_states TO cuectl_worker, cuectl_admin;
