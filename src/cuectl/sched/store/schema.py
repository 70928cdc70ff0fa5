"""The store's schema, one script per version, rendered for each database.

Forward-only: ``MIGRATIONS[i]`` brings a store from version i to i + 1, and a store at
version N has the same tables and columns on SQLite and PostgreSQL because both are
rendered from the same text (``Dialect.types``: INTEGER becomes BIGINT and REAL DOUBLE
PRECISION on PostgreSQL; ``{ID}`` is an auto-increment / identity primary key;
``{WITHOUT_ROWID}`` is a SQLite storage hint). Never edit a released version: add one.
"""

from __future__ import annotations

from cuectl.sched.dialect import Dialect

MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE jobs (
        id {ID},
        name TEXT NOT NULL,
        "user" TEXT NOT NULL,
        priority INTEGER NOT NULL DEFAULT 0,
        state TEXT NOT NULL DEFAULT 'PENDING',
        paused INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL,
        finished_at REAL
    );
    CREATE INDEX jobs_name ON jobs(name);
    CREATE TABLE layers (
        id {ID},
        job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
        idx INTEGER NOT NULL,
        name TEXT NOT NULL,
        command TEXT NOT NULL,
        range TEXT NOT NULL,
        chunk INTEGER NOT NULL,
        gpus INTEGER NOT NULL,
        gpu_vendor TEXT,
        gpu_models TEXT NOT NULL,
        gpu_memory_min_bytes INTEGER NOT NULL,
        cores REAL NOT NULL,
        memory_bytes INTEGER NOT NULL,
        retries INTEGER NOT NULL,
        timeout_s REAL,
        env TEXT NOT NULL,
        tags TEXT NOT NULL,
        depends TEXT NOT NULL,
        depend_count INTEGER NOT NULL DEFAULT 0,
        UNIQUE (job_id, name)
    );
    CREATE TABLE layer_deps (
        layer_id INTEGER NOT NULL,
        on_layer_id INTEGER NOT NULL,
        PRIMARY KEY (on_layer_id, layer_id)
    ){WITHOUT_ROWID};
    CREATE TABLE frames (
        id {ID},
        job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
        layer_id INTEGER NOT NULL REFERENCES layers(id) ON DELETE CASCADE,
        number INTEGER NOT NULL,
        frames TEXT NOT NULL,
        state TEXT NOT NULL,
        depend_count INTEGER NOT NULL DEFAULT 0,
        attempts INTEGER NOT NULL DEFAULT 0,
        host TEXT,
        worker TEXT,
        gpu_uuids TEXT,
        lease_expires REAL,
        action TEXT,
        exit_code INTEGER,
        exit_signal INTEGER,
        started_at REAL,
        ended_at REAL,
        waiting_since REAL,
        max_rss_bytes INTEGER,
        cpu_seconds REAL,
        gpu_util_mean_pct REAL,
        gpu_util_max_pct REAL,
        gpu_memory_peak_bytes INTEGER,
        gpu_seconds REAL,
        gpu_busy_seconds REAL,
        log_path TEXT
    );
    CREATE INDEX frames_layer_state ON frames(layer_id, state, id);
    CREATE INDEX frames_job_state ON frames(job_id, state, id);
    CREATE INDEX frames_running ON frames(state, lease_expires) WHERE state = 'RUNNING';
    CREATE TABLE frame_deps (
        on_frame_id INTEGER NOT NULL,
        frame_id INTEGER NOT NULL,
        PRIMARY KEY (on_frame_id, frame_id)
    ){WITHOUT_ROWID};
    CREATE TABLE hosts (
        name TEXT PRIMARY KEY,
        cores REAL NOT NULL,
        memory_bytes INTEGER NOT NULL,
        gpus TEXT NOT NULL,
        tags TEXT NOT NULL DEFAULT '[]',
        locked INTEGER NOT NULL DEFAULT 0,
        registered_at REAL NOT NULL,
        last_heartbeat REAL NOT NULL,
        worker_pid INTEGER,
        version TEXT,
        live TEXT
    );
    CREATE TABLE attempts (
        id {ID},
        frame_id INTEGER NOT NULL REFERENCES frames(id) ON DELETE CASCADE,
        attempt INTEGER NOT NULL,
        job_id INTEGER NOT NULL,
        host TEXT,
        gpu_uuids TEXT NOT NULL DEFAULT '[]',
        outcome TEXT NOT NULL,
        waiting_since REAL,
        started_at REAL,
        ended_at REAL,
        exit_code INTEGER,
        exit_signal INTEGER,
        timed_out INTEGER NOT NULL DEFAULT 0,
        max_rss_bytes INTEGER,
        cpu_seconds REAL,
        cores REAL,
        usage TEXT,
        UNIQUE (frame_id, attempt)
    );
    CREATE INDEX attempts_ended ON attempts(ended_at);
    """,
    # v2: per-attempt GPU accounting columns (reports read these, not JSON) and the
    # bounded per-device sample series of each attempt.
    """
    ALTER TABLE attempts ADD COLUMN gpu_util_mean_pct REAL;
    ALTER TABLE attempts ADD COLUMN gpu_util_max_pct REAL;
    ALTER TABLE attempts ADD COLUMN gpu_memory_peak_bytes INTEGER;
    ALTER TABLE attempts ADD COLUMN gpu_seconds REAL;
    ALTER TABLE attempts ADD COLUMN gpu_busy_seconds REAL;
    ALTER TABLE attempts ADD COLUMN gpu_models TEXT;
    CREATE INDEX attempts_job ON attempts(job_id);
    CREATE TABLE samples (
        frame_id INTEGER NOT NULL REFERENCES frames(id) ON DELETE CASCADE,
        attempt INTEGER NOT NULL,
        uuid TEXT NOT NULL,
        points TEXT NOT NULL,
        PRIMARY KEY (frame_id, attempt, uuid)
    ){WITHOUT_ROWID};
    """,
    # v3: who submitted a job, as proven by the database server (PostgreSQL's current role;
    # NULL on SQLite), the submitter's receipt file (SQLite: its owner is the proof), and a
    # per-layer cap on each attempt's log; a RUNNING frame's latest GPU sample (the worker
    # writes it every sampling interval; NULL when not running or not sampled yet); API
    # tokens (stored as SHA-256 hashes: the secret is shown once, at creation).
    """
    ALTER TABLE jobs ADD COLUMN submitted_by TEXT{SUBMITTER};
    ALTER TABLE jobs ADD COLUMN receipt TEXT;
    ALTER TABLE layers ADD COLUMN log_limit_bytes INTEGER;
    ALTER TABLE frames ADD COLUMN gpu_util_pct REAL;
    ALTER TABLE frames ADD COLUMN gpu_memory_used_bytes INTEGER;
    ALTER TABLE frames ADD COLUMN gpu_sampled_at REAL;
    CREATE TABLE tokens (
        id {ID},
        "user" TEXT NOT NULL,
        role TEXT NOT NULL,
        hash TEXT NOT NULL UNIQUE,
        label TEXT,
        created_at REAL NOT NULL,
        created_by TEXT NOT NULL,
        revoked_at REAL,
        last_used_at REAL
    );
    """,
    # v4: PostgreSQL records the *current* role as the submitter (below), so an API server
    # acting for a token's user with SET ROLE submits as that user. Nothing else changes.
    "",
    # v5: when a job was killed (NULL: never, or retried since), so a killed job is told from
    # a successful one (both end with every frame done or eaten).
    """
    ALTER TABLE jobs ADD COLUMN killed_at REAL;
    """,
    # v6: scheduling a farm can trust (docs/scheduling.md). Caps per job and layer, named
    # limits shared across jobs (a licence pool) and the layers that hold them, quotas per
    # user and project; a failed frame's next attempt waits until retry_at (back-off); why
    # each attempt failed (kind and text), and the latest reason on the frame itself.
    """
    ALTER TABLE jobs ADD COLUMN project TEXT;
    ALTER TABLE jobs ADD COLUMN max_running INTEGER;
    ALTER TABLE jobs ADD COLUMN max_cores REAL;
    ALTER TABLE jobs ADD COLUMN max_gpus INTEGER;
    ALTER TABLE layers ADD COLUMN max_running INTEGER;
    ALTER TABLE layers ADD COLUMN limits TEXT NOT NULL DEFAULT '[]';
    ALTER TABLE layers ADD COLUMN retry_delay_s REAL;
    ALTER TABLE frames ADD COLUMN retry_at REAL;
    ALTER TABLE frames ADD COLUMN failure TEXT;
    ALTER TABLE attempts ADD COLUMN failure_kind TEXT;
    ALTER TABLE attempts ADD COLUMN failure TEXT;
    CREATE TABLE limits (
        name TEXT PRIMARY KEY,
        max_running INTEGER NOT NULL
    );
    CREATE TABLE layer_limits (
        name TEXT NOT NULL,
        layer_id INTEGER NOT NULL REFERENCES layers(id) ON DELETE CASCADE,
        PRIMARY KEY (name, layer_id)
    );
    CREATE TABLE quotas (
        kind TEXT NOT NULL,
        name TEXT NOT NULL,
        max_gpus INTEGER,
        max_cores REAL,
        PRIMARY KEY (kind, name)
    );
    CREATE INDEX jobs_user_state ON jobs("user", state);
    CREATE INDEX frames_running_job ON frames(job_id) WHERE state = 'RUNNING';
    """,
    # v7: where a layer's frames run (the submitter's working directory, captured at submit:
    # sbatch's convention) and which of the submitter's environment travelled with the job;
    # notifications: what a job asked to be told (jobs.notify, JSON) and one row per event to
    # deliver, so that each is delivered once, retried with back-off, whoever delivers it.
    """
    ALTER TABLE layers ADD COLUMN cwd TEXT;
    ALTER TABLE jobs ADD COLUMN notify TEXT NOT NULL DEFAULT '[]';
    CREATE TABLE notifications (
        id {ID},
        job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
        event TEXT NOT NULL,
        frame_id INTEGER NOT NULL DEFAULT 0,
        target TEXT NOT NULL,
        created_at REAL NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        next_at REAL NOT NULL,
        claimed_by TEXT,
        claimed_until REAL,
        delivered_at REAL,
        error TEXT,
        UNIQUE (job_id, event, frame_id, target)
    );
    CREATE INDEX notifications_due ON notifications(next_at) WHERE delivered_at IS NULL;
    """,
    # v8: OpenCue compatibility (docs/opencue.md). Every dependency type, within a job and
    # across jobs: one ``depends`` row per dependency a user asked for (what `job show`
    # lists and `job undepend` drops), expanded like Cuebot's into edges between a waiting
    # frame or layer and what it waits on. Spec dependencies inside one job keep their bulk
    # edge tables (now naming their depend row, and a layer edge may wait for *any* frame);
    # the other kinds go to depend_edges, keyed by what they wait on (on_kind: frame, layer,
    # any: any frame of the layer, job). A job's show and shot; services: named resource
    # defaults that layers refer to (`service:`).
    """
    CREATE TABLE depends (
        id {ID},
        type TEXT NOT NULL,
        job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
        layer_id INTEGER,
        frame_id INTEGER,
        on_job_id INTEGER NOT NULL,
        on_layer_id INTEGER,
        on_frame_id INTEGER,
        any_frame INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL,
        satisfied_at REAL
    );
    CREATE INDEX depends_job ON depends(job_id);
    CREATE INDEX depends_on_job ON depends(on_job_id);
    CREATE TABLE depend_edges (
        id {ID},
        depend_id INTEGER NOT NULL,
        layer_id INTEGER,
        frame_id INTEGER,
        on_kind TEXT NOT NULL,
        on_id INTEGER NOT NULL
    );
    CREATE INDEX depend_edges_on ON depend_edges(on_kind, on_id);
    CREATE INDEX depend_edges_depend ON depend_edges(depend_id);
    ALTER TABLE frame_deps ADD COLUMN depend_id INTEGER;
    ALTER TABLE layer_deps ADD COLUMN depend_id INTEGER;
    ALTER TABLE layer_deps ADD COLUMN any_frame INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN show TEXT;
    ALTER TABLE jobs ADD COLUMN shot TEXT;
    CREATE TABLE services (
        name TEXT PRIMARY KEY,
        cores REAL,
        memory_bytes INTEGER,
        gpus INTEGER,
        gpu_memory_min_bytes INTEGER,
        tags TEXT,
        timeout_s REAL
    );
    """,
    # v9: a layer's per-device version minimums (docs/scheduling.md): CUDA compute
    # capability, driver version and the driver's CUDA version, dotted texts as submitted
    # (NULL: any), compared numerically by the worker's device match.
    """
    ALTER TABLE layers ADD COLUMN gpu_capability_min TEXT;
    ALTER TABLE layers ADD COLUMN gpu_driver_min TEXT;
    ALTER TABLE layers ADD COLUMN gpu_cuda_min TEXT;
    """,
    # v10: a GPU out-of-memory retried on a bigger GPU (docs/scheduling.md): the layer's
    # choice (NULL: ``same``, retried on any fitting device), and per frame the total
    # memory of the largest device its last attempt ran out of memory on (NULL: none), so
    # its next attempt is given only devices with more.
    """
    ALTER TABLE layers ADD COLUMN retry_on_gpu_oom TEXT;
    ALTER TABLE frames ADD COLUMN gpu_oom_bytes INTEGER;
    """,
    # v11: a service's defaults for the per-device version minimums (NULL: none).
    """
    ALTER TABLE services ADD COLUMN gpu_capability_min TEXT;
    ALTER TABLE services ADD COLUMN gpu_driver_min TEXT;
    ALTER TABLE services ADD COLUMN gpu_cuda_min TEXT;
    """,
    # v12: the GPU's own truth (docs/gpu-health.md). Per layer: what to do about a frame's
    # process on a device it was not given (``gpu_escape``: warn|kill, NULL: the worker's
    # default), about devices held idle (``gpu_idle_limit_s`` seconds under
    # ``gpu_idle_util`` %, then ``gpu_idle_action``: warn|kill), and a share of one GPU by
    # memory budget (``gpu_share_bytes``, NULL: whole devices) with its enforcement
    # (``gpu_share_enforce``: warn|kill). ``gpu_events``: what the worker saw on the devices
    # (escape, foreign, idle, over-budget, xid, lost, drain ...), per attempt where a frame
    # is concerned (NULL frame: a lease's or a device's own). ``device_states``: devices taken
    # out of service on a host (drained by hand or by the worker, lost), with why; a device
    # without a row is ok. Per attempt, the device-seconds it held idle by the layer's rule.
    # Per frame, a host its next attempt must not run on (its last attempt was stopped there
    # for a GPU escape), cleared by the next claim.
    """
    ALTER TABLE frames ADD COLUMN avoid_host TEXT;
    ALTER TABLE layers ADD COLUMN gpu_escape TEXT;
    ALTER TABLE layers ADD COLUMN gpu_idle_limit_s REAL;
    ALTER TABLE layers ADD COLUMN gpu_idle_action TEXT;
    ALTER TABLE layers ADD COLUMN gpu_idle_util REAL;
    ALTER TABLE layers ADD COLUMN gpu_share_bytes INTEGER;
    ALTER TABLE layers ADD COLUMN gpu_share_enforce TEXT;
    ALTER TABLE attempts ADD COLUMN gpu_idle_seconds REAL;
    CREATE TABLE gpu_events (
        id {ID},
        host TEXT NOT NULL,
        kind TEXT NOT NULL,
        at REAL NOT NULL,
        job_id INTEGER REFERENCES jobs(id) ON DELETE CASCADE,
        frame_id INTEGER REFERENCES frames(id) ON DELETE CASCADE,
        attempt INTEGER,
        device_uuid TEXT,
        device_index INTEGER,
        pid INTEGER,
        memory_bytes INTEGER,
        detail TEXT
    );
    CREATE INDEX gpu_events_frame ON gpu_events(frame_id, attempt);
    CREATE INDEX gpu_events_kind ON gpu_events(kind, at);
    CREATE TABLE device_states (
        host TEXT NOT NULL,
        uuid TEXT NOT NULL,
        state TEXT NOT NULL,
        reason TEXT,
        since REAL NOT NULL,
        by_user TEXT,
        automatic INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (host, uuid)
    );
    """,
)


def _submitter_function(who: str) -> str:
    """The trigger function that records who inserted a job (``who``: the server's notion
    of the acting role), whatever the client sent, and forbids changing it afterwards."""
    return f"""CREATE OR REPLACE FUNCTION cuectl_submitter() RETURNS trigger LANGUAGE plpgsql AS $body$
        BEGIN
            IF TG_OP = 'INSERT' THEN
                NEW.submitted_by := {who};
            ELSIF NEW.submitted_by IS DISTINCT FROM OLD.submitted_by THEN
                RAISE EXCEPTION 'jobs.submitted_by is recorded by the server and cannot be changed'
                    USING ERRCODE = '42501';
            END IF;
            RETURN NEW;
        END $body$"""


# Statements one database alone runs after a version's shared script (not split on ';').
_ONLY: dict[tuple[int, str], tuple[str, ...]] = {
    (2, "postgresql"): (
        # Rows from before v3 got the migrating role as their default: they have no proof.
        "UPDATE jobs SET submitted_by = NULL",
        # The server, not the client, says who inserted a job, and nobody changes it after.
        _submitter_function("session_user"),
        "CREATE TRIGGER jobs_submitter BEFORE INSERT OR UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION cuectl_submitter()",
    ),
    (3, "postgresql"): (
        # current_user, not session_user: it differs only after SET ROLE, which the server
        # allows only to members of the role, who may act as it anyway.
        _submitter_function("current_user"),
    ),
}
SCHEMA_VERSION = len(MIGRATIONS)
# Every table of ours: a database holding some of them but no ``meta`` is not a cuectl store.
TABLES = (
    "meta",
    "jobs",
    "layers",
    "layer_deps",
    "frames",
    "frame_deps",
    "hosts",
    "attempts",
    "samples",
    "tokens",
    "limits",
    "layer_limits",
    "quotas",
    "notifications",
    "depends",
    "depend_edges",
    "services",
    "gpu_events",
    "device_states",
)


def statements(version: int, dialect: Dialect) -> list[str]:
    """The statements that bring a store from ``version`` to ``version + 1``."""
    script = dialect.types(MIGRATIONS[version])
    return [s.strip() for s in script.split(";") if s.strip()] + list(_ONLY.get((version, dialect.name), ()))
