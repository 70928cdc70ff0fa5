"""Dependencies of every OpenCue type, within a job and across jobs (docs/opencue.md).

A dependency a user asks for is one ``depends`` row, in OpenCue's terms (job-on-job, ...,
frame-by-frame). It is expanded, as Cuebot expands it, into *edges* from a waiting frame or
layer to what it waits on: a frame (``frame``), a whole layer (``layer``), any frame of a
layer (``any``) or a whole job (``job``). Each edge adds one to its waiter's
``depend_count``; a frame is DEPEND while its own count or its layer's is above zero, and
the claim statement only ever reads WAITING frames, so dependencies cost claims nothing.

Edges are deleted as they are satisfied (a frame SUCCEEDED, a layer complete, a job
finished), and each deletion takes one from its waiter, so nothing is released twice.
Spec dependencies inside one job keep their bulk tables (``frame_deps``, ``layer_deps``,
written by ``lifecycle.plan_submit``); everything else lives in ``depend_edges``.

Functions here run inside a store transaction (``tx``: ``sql.Tx``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from cuectl.errors import InvalidInput
from cuectl.sched import model as m
from cuectl.sched.frameset import parse_frameset
from cuectl.sched.store.inlists import batches, marks

Tx = Any  # sql.Tx (imported there; this module is imported by sql)

# Where a waiter's count lives, by waiter kind.
_LAYER, _FRAME = "layer", "frame"
# What a job-level target needs: FINISHED, and killed or without DEAD frames (a job that ended
# with DEAD frames holds its dependents until they are retried or eaten; OpenCue keeps such a
# job in the cue, unfinished). Killing a job releases what waits on it, as Cuebot's shutdown.
RELEASABLE_JOB = (
    "jobs.state = 'FINISHED' AND (jobs.killed_at IS NOT NULL OR NOT EXISTS "
    "(SELECT 1 FROM frames d WHERE d.job_id = jobs.id AND d.state = 'DEAD'))"
)


@dataclass(frozen=True)
class Request:
    """One dependency to add, with the ids already resolved. Waiter: ``layer_id`` and
    ``frame_id`` None for the whole job; target likewise with ``on_*``."""

    type: str  # one of m.OPENCUE_DEPEND_TYPES
    job_id: int
    on_job_id: int
    layer_id: int | None = None
    frame_id: int | None = None
    on_layer_id: int | None = None
    on_frame_id: int | None = None
    any_frame: bool = False


def depend_type(waiter: str, target: str, how: str) -> str:
    """The OpenCue type of a dependency of ``waiter`` (job, layer, frame) on ``target``
    (job, layer, frame); ``how`` says how a layer waits on a layer (model.DependType)."""
    if waiter == "layer" and target == "layer" and how in ("frame", "previous"):
        return "frame-by-frame" if how == "frame" else "previous-frame"
    return f"{waiter}-on-{target}"


# -- releasing -------------------------------------------------------------------------------
def wake_frames(tx: Tx, counts: Mapping[int, int], now: float) -> int:
    """Take ``counts[f]`` from each frame's count; those at zero whose layer waits on nothing
    become WAITING. Returns how many did."""
    woke = 0
    for n, ids in _by_count(counts).items():
        for batch in batches(sorted(ids)):
            inside = marks(len(batch))
            tx.run(
                f"UPDATE frames SET depend_count = CASE WHEN depend_count > ? THEN depend_count - ? ELSE 0 END "
                f"WHERE id IN ({inside})",
                (n, n, *batch),
            )
            woke += tx.run(
                f"UPDATE frames SET state = 'WAITING', waiting_since = ? WHERE id IN ({inside}) "
                "AND state = 'DEPEND' AND depend_count = 0 "
                "AND (SELECT depend_count FROM layers WHERE id = frames.layer_id) = 0",
                (now, *batch),
            )
    return woke


def _by_count(counts: Mapping[int, int]) -> dict[int, list[int]]:
    """The ids of ``counts`` grouped by their count: one UPDATE per distinct count."""
    out: dict[int, list[int]] = {}
    for key, n in counts.items():
        out.setdefault(n, []).append(key)
    return out


def wake_layers(tx: Tx, counts: Mapping[int, int], now: float) -> int:
    """Take ``counts[l]`` from each layer's count; at zero, its DEPEND frames that wait on
    nothing themselves become WAITING. Returns how many frames did."""
    woke = 0
    for layer_id, n in sorted(counts.items()):
        tx.run(
            "UPDATE layers SET depend_count = CASE WHEN depend_count > ? THEN depend_count - ? ELSE 0 END WHERE id = ?",
            (n, n, layer_id),
        )
        woke += tx.run(
            "UPDATE frames SET state = 'WAITING', waiting_since = ? WHERE layer_id = ? "
            "AND state = 'DEPEND' AND depend_count = 0 AND (SELECT depend_count FROM layers "
            "WHERE id = ?) = 0",
            (now, layer_id, layer_id),
        )
    return woke


def wake(tx: Tx, rows: Iterable[Any], now: float) -> int:
    """Satisfy released edges (rows with ``layer_id`` and ``frame_id``, one of them set)."""
    frames: Counter[int] = Counter()
    layers: Counter[int] = Counter()
    for r in rows:
        if r["frame_id"] is not None:
            frames[int(r["frame_id"])] += 1
        elif r["layer_id"] is not None:
            layers[int(r["layer_id"])] += 1
    return (wake_frames(tx, frames, now) if frames else 0) + (wake_layers(tx, layers, now) if layers else 0)


def release_frame(tx: Tx, frame_id: int, layer_id: int, now: float) -> int:
    """What waits on this frame, or on any frame of its layer (it just released)."""
    woke = wake(
        tx,
        tx.all(
            "DELETE FROM depend_edges WHERE (on_kind = 'frame' AND on_id = ?) "
            "OR (on_kind = 'any' AND on_id = ?) RETURNING layer_id, frame_id",
            (frame_id, layer_id),
        ),
        now,
    )
    any_layers = Counter(
        int(r["layer_id"])
        for r in tx.all(
            "DELETE FROM layer_deps WHERE on_layer_id = ? AND any_frame = 1 RETURNING layer_id", (layer_id,)
        )
    )
    return woke + (wake_layers(tx, any_layers, now) if any_layers else 0)


def release_layer(tx: Tx, layer_id: int, now: float) -> int:
    """What waits on this whole layer (it just completed); ``layer_deps`` are the caller's."""
    return wake(
        tx,
        tx.all(
            "DELETE FROM depend_edges WHERE on_kind = 'layer' AND on_id = ? RETURNING layer_id, frame_id", (layer_id,)
        ),
        now,
    )


def release_jobs(tx: Tx, job_ids: Sequence[int], now: float) -> int:
    """What waits on these jobs, where they are finished and releasable (RELEASABLE_JOB)."""
    woke = 0
    for batch in batches(sorted(job_ids)):
        woke += wake(
            tx,
            tx.all(
                f"DELETE FROM depend_edges WHERE on_kind = 'job' AND on_id IN (SELECT id FROM jobs WHERE id IN "
                f"({marks(len(batch))}) AND {RELEASABLE_JOB}) RETURNING layer_id, frame_id",
                batch,
            ),
            now,
        )
    return woke


# -- adding ----------------------------------------------------------------------------------
def _frame_done(eaten: bool) -> str:
    return "('SUCCEEDED', 'EATEN')" if eaten else "('SUCCEEDED')"


def layer_frames(tx: Tx, layer_id: int) -> list[tuple[int, tuple[int, ...]]]:
    """(frame id, its frame numbers) of a layer, in dispatch (range) order."""
    return [
        (int(r["id"]), tuple(parse_frameset(r["frames"], limit=2**31)))
        for r in tx.all("SELECT id, frames FROM frames WHERE layer_id = ? ORDER BY id", (layer_id,))
    ]


def frame_pairs(
    kind: str, mine: Sequence[tuple[int, tuple[int, ...]]], theirs: Sequence[tuple[int, tuple[int, ...]]]
) -> set[tuple[int, int]]:
    """(waiting frame, frame waited on) of a frame-level dependency between two layers'
    frames (id, numbers), at submit (``lifecycle.plan_submit``) as afterwards.
    ``frame-by-frame``: frame N waits on the frame holding N (several chunks when the
    chunkings differ); ``previous-frame`` (Cuebot's PreviousFrame): the frame at position
    i of our range waits on the one at position i - 1 of theirs — on its own layer a chunk
    never waits on itself."""
    my_ids = {n: fid for fid, numbers in mine for n in numbers}
    up_ids = {n: fid for fid, numbers in reversed(theirs) for n in numbers}  # first chunk holding n wins
    my_order = [n for _, numbers in mine for n in numbers]
    if kind == "frame-by-frame":
        return {(my_ids[n], up_ids[n]) for n in my_order if n in up_ids}
    up_order = [n for _, numbers in theirs for n in numbers]
    pairs = {(my_ids[my_order[i]], up_ids[up_order[i - 1]]) for i in range(1, min(len(my_order), len(up_order) + 1))}
    return {(a, b) for a, b in pairs if a != b}


def _done_frames(tx: Tx, ids: Iterable[int], eaten: bool) -> set[int]:
    done: set[int] = set()
    for batch in batches(sorted(set(ids))):
        done |= {
            int(r["id"])
            for r in tx.all(
                f"SELECT id FROM frames WHERE id IN ({marks(len(batch))}) AND state IN {_frame_done(eaten)}", batch
            )
        }
    return done


def _target_done(tx: Tx, kind: str, target: int, eaten: bool) -> bool:
    if kind == "frame":
        return bool(_done_frames(tx, [target], eaten))
    if kind == "any":
        return bool(
            tx.one(f"SELECT 1 FROM frames WHERE layer_id = ? AND state IN {_frame_done(eaten)} LIMIT 1", (target,))
        )
    if kind == "layer":
        return not tx.one(
            f"SELECT 1 FROM frames WHERE layer_id = ? AND state NOT IN {_frame_done(eaten)} LIMIT 1", (target,)
        )
    return bool(tx.one(f"SELECT 1 FROM jobs WHERE id = ? AND {RELEASABLE_JOB}", (target,)))


def expand(tx: Tx, req: Request, eaten: bool) -> list[tuple[int | None, int | None, str, int]]:
    """The edges of ``req`` still to wait on: (waiting layer, waiting frame, on_kind, on_id);
    targets already done are left out (such a dependency is recorded, and satisfied)."""
    if req.type in ("frame-by-frame", "previous-frame", "layer-on-sim-frame"):
        assert req.layer_id is not None and req.on_layer_id is not None
        mine = layer_frames(tx, req.layer_id)
        if req.type == "layer-on-sim-frame":
            assert req.on_frame_id is not None
            pairs = {(fid, req.on_frame_id) for fid, _ in mine if fid != req.on_frame_id}
        else:
            pairs = frame_pairs(req.type, mine, layer_frames(tx, req.on_layer_id))
        done = _done_frames(tx, (b for _, b in pairs), eaten)
        return [(None, a, "frame", b) for a, b in sorted(pairs) if b not in done]
    if req.on_frame_id is not None:
        target: tuple[str, int] = ("frame", req.on_frame_id)
    elif req.on_layer_id is not None:
        target = ("any" if req.any_frame else "layer", req.on_layer_id)
    else:
        target = ("job", req.on_job_id)
    if _target_done(tx, *target, eaten):
        return []
    if req.frame_id is not None:
        return [(None, req.frame_id, *target)]
    if req.layer_id is not None:
        return [(req.layer_id, None, *target)]
    return [
        (int(r["id"]), None, *target)
        for r in tx.all("SELECT id FROM layers WHERE job_id = ? ORDER BY idx", (req.job_id,))
    ]


def add(tx: Tx, req: Request, *, now: float, eaten: bool) -> int:
    """Record ``req`` and make its waiters wait; return its id."""
    depend_id = int(
        tx.one(
            "INSERT INTO depends(type, job_id, layer_id, frame_id, on_job_id, on_layer_id, on_frame_id, any_frame, "
            "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
            (
                req.type,
                req.job_id,
                req.layer_id,
                req.frame_id,
                req.on_job_id,
                req.on_layer_id,
                req.on_frame_id,
                int(req.any_frame),
                now,
            ),
        )["id"]
    )
    edges = expand(tx, req, eaten)
    if not edges:
        return depend_id
    tx.many(
        "INSERT INTO depend_edges(depend_id, layer_id, frame_id, on_kind, on_id) VALUES (?, ?, ?, ?, ?)",
        [(depend_id, *edge) for edge in edges],
    )
    layers = Counter(layer for layer, _, _, _ in edges if layer is not None)
    frames = Counter(frame for _, frame, _, _ in edges if frame is not None)
    for layer_id, n in sorted(layers.items()):
        tx.run("UPDATE layers SET depend_count = depend_count + ? WHERE id = ?", (n, layer_id))
        tx.run("UPDATE frames SET state = 'DEPEND' WHERE layer_id = ? AND state = 'WAITING'", (layer_id,))
    for n, ids in _by_count(frames).items():
        for batch in batches(sorted(ids)):
            inside = marks(len(batch))
            tx.run(f"UPDATE frames SET depend_count = depend_count + ? WHERE id IN ({inside})", (n, *batch))
            tx.run(f"UPDATE frames SET state = 'DEPEND' WHERE id IN ({inside}) AND state = 'WAITING'", batch)
    return depend_id


def waits_on_job(tx: Tx, start: int, goal: int) -> bool:
    """Whether job ``start`` waits, through dependencies still unmet, on job ``goal``."""
    seen, todo = {start}, [start]
    while todo:
        job = todo.pop()
        for r in tx.all(
            "SELECT DISTINCT d.on_job_id FROM depends d WHERE d.job_id = ? AND d.on_job_id != d.job_id "
            "AND EXISTS (SELECT 1 FROM depend_edges e WHERE e.depend_id = d.id)",
            (job,),
        ):
            nxt = int(r["on_job_id"])
            if nxt == goal:
                return True
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return False


# -- dropping --------------------------------------------------------------------------------
def drop(tx: Tx, job_id: int, depend_ids: Sequence[int] | None, now: float) -> int:
    """Satisfy the given dependencies of a job (None: all it waits on, including any older
    than the ``depends`` rows); return how many frames became WAITING."""
    released: list[Any] = []
    if depend_ids is None:
        frames = "(SELECT id FROM frames WHERE job_id = ?)"
        layers = "(SELECT id FROM layers WHERE job_id = ?)"
        released += tx.all(
            f"DELETE FROM depend_edges WHERE frame_id IN {frames} OR layer_id IN {layers} RETURNING layer_id, frame_id",
            (job_id, job_id),
        )
        released += tx.all(
            f"DELETE FROM frame_deps WHERE frame_id IN {frames} RETURNING frame_id, NULL AS layer_id", (job_id,)
        )
        released += tx.all(
            f"DELETE FROM layer_deps WHERE layer_id IN {layers} RETURNING layer_id, NULL AS frame_id", (job_id,)
        )
        tx.run("UPDATE depends SET satisfied_at = ? WHERE job_id = ? AND satisfied_at IS NULL", (now, job_id))
    else:
        for batch in batches(sorted(depend_ids)):
            inside = marks(len(batch))
            released += tx.all(
                f"DELETE FROM depend_edges WHERE depend_id IN ({inside}) RETURNING layer_id, frame_id", batch
            )
            released += tx.all(
                f"DELETE FROM frame_deps WHERE depend_id IN ({inside}) RETURNING frame_id, NULL AS layer_id", batch
            )
            released += tx.all(
                f"DELETE FROM layer_deps WHERE depend_id IN ({inside}) RETURNING layer_id, NULL AS frame_id", batch
            )
            tx.run(
                f"UPDATE depends SET satisfied_at = ? WHERE id IN ({inside}) AND satisfied_at IS NULL", (now, *batch)
            )
    return wake(tx, released, now)


# -- reading ---------------------------------------------------------------------------------
_DEPEND_SELECT = """
    SELECT d.*, j.name AS job_name, l.name AS layer_name, f.number AS frame_number,
           oj.name AS on_job_name, ol.name AS on_layer_name, ofr.number AS on_frame_number,
           (SELECT COUNT(*) FROM depend_edges e WHERE e.depend_id = d.id)
           + (SELECT COUNT(*) FROM frame_deps e WHERE e.depend_id = d.id)
           + (SELECT COUNT(*) FROM layer_deps e WHERE e.depend_id = d.id) AS waiting_edges
    FROM depends d JOIN jobs j ON j.id = d.job_id
    LEFT JOIN layers l ON l.id = d.layer_id LEFT JOIN frames f ON f.id = d.frame_id
    LEFT JOIN jobs oj ON oj.id = d.on_job_id LEFT JOIN layers ol ON ol.id = d.on_layer_id
    LEFT JOIN frames ofr ON ofr.id = d.on_frame_id
"""


def depend_json(r: Mapping[str, Any]) -> dict[str, Any]:
    """One ``depends`` row as `job show --json` prints it."""
    state = "dropped" if r["satisfied_at"] is not None else ("waiting" if r["waiting_edges"] else "satisfied")
    return {
        "id": int(r["id"]),
        "type": r["type"],
        "state": state,
        "job": {"id": int(r["job_id"]), "name": r["job_name"]},
        "layer": r["layer_name"],
        "frame": r["frame_number"],
        "on_job": {"id": int(r["on_job_id"]), "name": r["on_job_name"]},
        "on_layer": r["on_layer_name"],
        "on_frame": r["on_frame_number"],
        "any_frame": bool(r["any_frame"]),
        "created_at": r["created_at"],
        "dropped_at": r["satisfied_at"],
    }


def list_sql(where: str) -> str:
    return f"{_DEPEND_SELECT} WHERE {where} ORDER BY d.id"


# -- the workers' sweep ----------------------------------------------------------------------
def stale_sql(eaten: bool) -> str:
    """The edges whose target is done (``sweep``)."""
    done = _frame_done(eaten)
    return (
        "SELECT e.id, e.layer_id, e.frame_id FROM depend_edges e WHERE "
        f"(e.on_kind = 'frame' AND EXISTS (SELECT 1 FROM frames f WHERE f.id = e.on_id AND f.state IN {done})) "
        f"OR (e.on_kind = 'any' AND EXISTS (SELECT 1 FROM frames f WHERE f.layer_id = e.on_id "
        f"AND f.state IN {done})) "
        f"OR (e.on_kind = 'layer' AND NOT EXISTS (SELECT 1 FROM frames f WHERE f.layer_id = e.on_id "
        f"AND f.state NOT IN {done})) "
        f"OR (e.on_kind = 'job' AND EXISTS (SELECT 1 FROM jobs WHERE jobs.id = e.on_id AND {RELEASABLE_JOB})) "
        "ORDER BY e.id"
    )


def sweep(tx: Tx, now: float, eaten: bool) -> int:
    """Release edges whose target is already done. Normally each is released in the
    transaction that completes its target; this catches those that one could not (on
    PostgreSQL with roles, a user killing their own job cannot change another user's waiting
    frames) and any left by a race, as Cuebot's stale-depend sweep does."""
    stale = tx.all(stale_sql(eaten))
    if not stale:
        return 0
    removed: list[Any] = []
    for batch in batches([int(r["id"]) for r in stale]):
        removed += tx.all(
            f"DELETE FROM depend_edges WHERE id IN ({marks(len(batch))}) RETURNING layer_id, frame_id", batch
        )
    return wake(tx, removed, now)


def check_type(kind: str) -> str:
    if kind not in m.OPENCUE_DEPEND_TYPES:
        raise InvalidInput(
            f"--type: {kind!r} is not a dependency type (expected one of {', '.join(m.OPENCUE_DEPEND_TYPES)})"
        )
    return kind
