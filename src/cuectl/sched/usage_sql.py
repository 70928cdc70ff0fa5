"""The accounting report's per-group sums, computed by the database (``cuectl admin report``).

One SQL text serves both stores: the few places where SQLite and PostgreSQL differ (named
placeholders, JSON array functions, whole days) are a ``cuectl.sched.dialect.Dialect``. The database does the
per-attempt work — 100,000 attempts must report in well under a second, and handing each
one to Python as a record cost more than the whole budget — and returns one row per group
plus each group's queue waits (only those cross to Python one per attempt, for exact
percentiles; _read_waits reads them keyed by what needs no join, _place_waits names the
groups after). Where the store has a second reader of the same snapshot (SQLite), the waits
and the window's extra figures are read on it, on a thread of their own, while the sums run:
the database works without the GIL, so the report takes both cores.
What the figures mean is in ``cuectl.report`` and
docs/accounting.md; this module only has to add them up the way it says:

- wall = ended - started (0 when either is missing or the clock went backwards);
- GPU-seconds allocated = the worker's ``gpu_seconds``, or wall × devices for an attempt the
  worker never reported (lost, requeued): its devices were held all the same;
- a frame is dead in the window when its last attempt in the window failed;
- ``--by gpu-model`` gives an attempt on several models an even share of its GPU figures per
  device, and counts the attempt whole in each of its models. An attempt the worker never
  reported has no models recorded: each of its devices takes its model from the inventory
  its host registered (``hosts.gpus``, by UUID), and only a device no inventory lists is
  ``unknown``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence, TypeVar

from cuectl.sched.dialect import POSTGRES, SQLITE, Dialect  # noqa: F401  (re-exported for the stores)

# Outcomes after which a frame can be DEAD (``store.lifecycle``). A user's
# ``eat``/``retry`` and a worker's requeue (``worker stopped``, ``drain``, ``orphaned``…) are
# not failures of the frame.
FAILED_OUTCOMES = frozenset({"failed", "timeout", "killed", "lost"})
SUCCEEDED = "succeeded"
CPU_GROUP = "cpu"  # --by gpu-model: attempts that used no GPU
UNKNOWN_MODEL = "unknown"  # --by gpu-model: a held device whose model is neither recorded nor in its host's inventory
GROUPINGS = ("job", "layer", "user", "project", "show", "host", "gpu-model", "day")
# Groupings that put all of a frame's attempts in one group.
FRAME_PARTITIONS = frozenset({"job", "layer", "user", "project", "show"})

Fetch = Callable[[str, Mapping[str, Any]], Sequence[Sequence[Any]]]


@dataclass
class UsageGroup:
    """The sums of one group. ``key`` is the grouping's key columns: (job id, job name),
    (job name, layer name), (user,), (project or show, None for a job without one), (host,), (model,),
    (UTC day number,), or () for the whole window."""

    key: tuple
    frames: int = 0
    attempts: int = 0
    succeeded: int = 0
    retries: int = 0
    dead: int = 0
    wall_seconds: float = 0.0
    core_seconds: float = 0.0
    gpu_seconds_allocated: float = 0.0
    gpu_seconds_busy: float = 0.0
    util_weighted: float = 0.0  # Σ mean utilisation × allocated, over attempts with both
    util_weight: float = 0.0  # Σ allocated over the same attempts
    gpu_memory_peak_bytes: int | None = None
    waits: list[float] = field(default_factory=list)  # queue waits of its attempts, sorted
    # Device-seconds held idle past the layers' gpu_idle_limit (docs/gpu-health.md).
    gpu_seconds_idle: float = 0.0


_KEYS: dict[str | None, tuple[str, ...]] = {
    "job": ("a.job_id", "j.name"),
    "layer": ("j.name", "l.name"),
    "user": ('j."user"',),
    "project": ("j.project",),  # NULL for a job without a project: the report's "-" group
    "show": ("j.show",),  # likewise for a job without a show
    "host": ("COALESCE(a.host, '-')",),
    "gpu-model": ("m.model",),  # see _base
    "day": ("{day}",),
    None: (),
}


def check_grouping(by: str | None) -> None:
    """A programming error, not user input: the CLI checks ``--by`` with its own message."""
    if by not in _KEYS:
        raise ValueError(f"unknown grouping {by!r}")


def _source(by: str | None, d: Dialect, hint: str) -> str:
    """The FROM clause: ``a`` (attempts) and whatever the grouping's key needs."""
    if by in ("job", "user", "project", "show"):
        return f"attempts a {hint} JOIN jobs j ON j.id = a.job_id"
    if by == "layer":
        return (
            f"attempts a {hint} JOIN jobs j ON j.id = a.job_id JOIN frames f ON f.id = a.frame_id "
            "JOIN layers l ON l.id = f.layer_id"
        )
    if by == "gpu-model":
        # Each distinct list of models (a farm has a handful) split into (model, share of the
        # devices) once, then joined to the attempts that have that list. Attempts without
        # models are the second half of _base's UNION.
        window = _window(d, "a2")
        lists = f"SELECT DISTINCT a2.gpu_models FROM attempts a2 {hint} WHERE {window} AND a2.gpu_models IS NOT NULL"
        share = f"CAST(COUNT(*) AS DOUBLE PRECISION) / {d.json_len('x.gpu_models')}"
        shares = (
            f"SELECT x.gpu_models AS models, e.value AS model, {share} AS share "
            f"FROM ({lists}) x, {d.each('x.gpu_models')} GROUP BY x.gpu_models, e.value"
        )
        return f"attempts a {hint} JOIN ({shares}) m ON m.models = a.gpu_models"
    return f"attempts a {hint}"


def _json_field(d: Dialect, expr: str, key: str) -> str:
    """A string field of a JSON object held as text (a device of ``hosts.gpus``)."""
    # Only this query reads into JSON objects; were a second to, it would belong in Dialect.
    if d.name == POSTGRES.name:
        return f"(({expr})::json ->> '{key}')"
    return f"json_extract({expr}, '$.{key}')"


def _inventory_source(d: Dialect, hint: str) -> str:
    """``--by gpu-model`` for attempts that held devices but recorded no models (lost, or
    requeued by a stopping worker): ``a`` joined to ``m`` (``aid``, ``model``, ``share``),
    one row per model of its devices, each device's model looked up by UUID in the
    inventory of the attempt's host, ``unknown`` where that has no such device."""
    inventory = (
        f"SELECT DISTINCT h.name AS host, {_json_field(d, 'e.value', 'uuid')} AS uuid, "
        f"{_json_field(d, 'e.value', 'model')} AS model FROM hosts h, {d.each('h.gpus')}"
    )
    model = f"COALESCE(inv.model, '{UNKNOWN_MODEL}')"
    # CROSS JOIN, not a comma: the LEFT JOIN's condition must see a3 (PostgreSQL binds
    # JOIN tighter than a comma), and a function in FROM may read a3 either way.
    shares = (
        f"SELECT a3.id AS aid, {model} AS model, "
        f"CAST(COUNT(*) AS DOUBLE PRECISION) / {d.json_len('a3.gpu_uuids')} AS share "
        f"FROM attempts a3 {hint} CROSS JOIN {d.each('a3.gpu_uuids')} "
        f"LEFT JOIN ({inventory}) inv ON inv.host = a3.host AND inv.uuid = e.value "
        f"WHERE {_window(d, 'a3')} AND a3.gpu_models IS NULL "
        f"GROUP BY a3.id, a3.gpu_uuids, {model}"
    )
    return f"attempts a {hint} JOIN ({shares}) m ON m.aid = a.id"


def _window(d: Dialect, alias: str) -> str:
    return f"{alias}.ended_at >= {d.param('since')} AND {alias}.ended_at < {d.param('until')}"


def _base(by: str | None, d: Dialect, hint: str, *, waits_only: bool = False, recorded: bool = True) -> tuple[str, int]:
    """The per-attempt rows (one per attempt and model for ``gpu-model``) with the values the
    sums need (or only the queue wait), and the number of key columns in front. Without
    ``recorded``, ``gpu-model`` leaves out the attempts with recorded models."""
    if by == "gpu-model":
        # Three kinds of attempt: with recorded models (_source), without models but with
        # devices (lost before reporting: models from the host inventory), and CPU-only.
        inventory = _select(["m.model"], "m.share", _inventory_source(d, hint), d, waits_only)
        cpu = _select([f"'{CPU_GROUP}'"], "1.0", f"attempts a {hint}", d, waits_only)
        cpu_only = f"a.gpu_models IS NULL AND {d.json_len('a.gpu_uuids')} = 0"
        rest = f"{inventory} UNION ALL {cpu} AND {cpu_only}"
        if not recorded:
            return rest, 1
        with_models = _select(list(_KEYS[by]), "m.share", _source(by, d, hint), d, waits_only)
        return f"{with_models} UNION ALL {rest}", 1
    keys = [k.format(day=d.day("a.ended_at")) for k in _KEYS[by]]
    return _select(keys, "1.0", _source(by, d, hint), d, waits_only), len(keys)


def _select(keys: list[str], share: str, source: str, d: Dialect, waits_only: bool) -> str:
    # Only the columns a query reads: a UNION ALL subquery is not flattened, and its
    # every column (the dead subplan too) would be computed for each row.
    keyed = [f"{k} AS k{i}" for i, k in enumerate(keys)]
    if waits_only:
        # aid: --by gpu-model's total takes each attempt's wait once from these rows.
        cols = keyed + [f"{_WAIT} AS wait", "a.id AS aid"]
        return f"SELECT {', '.join(cols)} FROM {source} WHERE {_window(d, 'a')}"
    wall = (
        "CASE WHEN a.started_at IS NOT NULL AND a.ended_at IS NOT NULL AND a.ended_at > a.started_at "
        "THEN a.ended_at - a.started_at ELSE 0.0 END"
    )
    failed = ", ".join(f"'{o}'" for o in sorted(FAILED_OUTCOMES))
    # Dead = failed and no later attempt of the frame in the window. Only failed attempts
    # (a few percent) look further, through the (frame_id, attempt) unique index.
    dead = (
        f"CASE WHEN a.outcome IN ({failed}) AND NOT EXISTS (SELECT 1 FROM attempts b WHERE b.frame_id = a.frame_id "
        f"AND b.attempt > a.attempt AND {_window(d, 'b')}) THEN 1 ELSE 0 END"
    )
    cols = keyed + [
        f"{share} AS share",
        "a.frame_id AS frame_id",
        "a.attempt AS attempt",
        "a.outcome AS outcome",
        f"{wall} AS wall",
        "COALESCE(a.cores, 0) AS cores",
        f"COALESCE(a.gpu_seconds, ({wall}) * {d.json_len('a.gpu_uuids')}) AS alloc",
        "COALESCE(a.gpu_busy_seconds, 0) AS busy",
        "COALESCE(a.gpu_idle_seconds, 0) AS idle",
        "a.gpu_util_mean_pct AS util",
        "a.gpu_memory_peak_bytes AS mem",
        f"{dead} AS dead",
    ]
    return f"SELECT {', '.join(cols)} FROM {source} WHERE {_window(d, 'a')}"


def sums_statements(by: str | None, d: Dialect, hint: str = "") -> list[str]:
    """The SQL of the sums a report of ``by`` prints (its groups, and the window's total
    where adding the groups up cannot give it), without the queue waits: what bench/
    bench_report.py gives the ``sqlite3`` shell as the peer of ``cuectl admin report``."""
    check_grouping(by)
    statements = [_sums_sql(*_base(by, d, hint))]
    if by == "gpu-model":
        statements.append(_sums_sql(*_base(None, d, hint)))
    elif by is not None and by not in FRAME_PARTITIONS:
        statements.append(_window_frames_sql(d, hint))
    return statements


def _sums_sql(base: str, nkeys: int) -> str:
    keys = [f"k{i}" for i in range(nkeys)]
    group = f" GROUP BY {', '.join(keys)}" if keys else ""
    return (
        f"SELECT {''.join(k + ', ' for k in keys)}COUNT(DISTINCT frame_id), COUNT(*), "
        f"SUM(CASE WHEN outcome = '{SUCCEEDED}' THEN 1 ELSE 0 END), SUM(CASE WHEN attempt > 1 THEN 1 ELSE 0 END), "
        "SUM(dead), SUM(wall), SUM(cores * wall), SUM(alloc * share), SUM(busy * share), "
        "SUM(CASE WHEN util IS NOT NULL AND alloc > 0 THEN util * alloc * share ELSE 0 END), "
        "SUM(CASE WHEN util IS NOT NULL AND alloc > 0 THEN alloc * share ELSE 0 END), MAX(mem), SUM(idle * share) "
        f"FROM ({base}) t{group}"
    )


def summarise(
    fetch: Fetch,
    dialect: Dialect,
    *,
    since: float,
    until: float,
    by: str | None,
    hint: str = "",
    with_total: bool = True,
    fetch_aside: Fetch | None = None,
) -> tuple[list[UsageGroup], UsageGroup | None]:
    """The window's groups (in no particular order) and, if asked, the whole window as one
    group. ``fetch(sql, params)`` runs a query and returns its rows as sequences; ``hint``
    goes after each scan of ``attempts`` (SQLite's ``NOT INDEXED``).

    ``fetch_aside``, when given, reads the same snapshot as ``fetch`` and may be called from
    another thread: the queue waits (one row per attempt, the other half of the time) are
    then read on it while the database adds up the sums on ``fetch``."""
    check_grouping(by)
    params = {"since": since, "until": until}
    aside = fetch_aside or fetch
    want_seen = with_total and by == "gpu-model"

    def read() -> _AsideRead:
        """What needs no group: the waits, and the window's figures the groups cannot give."""
        found = _read_waits(aside, dialect, by, hint, params, want_seen)
        if want_seen:  # an attempt sits in several model groups: the window is added up afresh
            found.window = _sums(aside, dialect, None, hint, params).get(()) or UsageGroup(())
        elif with_total and by is not None and by not in FRAME_PARTITIONS:  # a frame can be in two groups
            found.window_frames = int(aside(_window_frames_sql(dialect, hint), params)[0][0])
        return found

    if fetch_aside is None:
        groups = _sums(fetch, dialect, by, hint, params)
        found = read()
    else:
        groups, found = _alongside(lambda: _sums(fetch, dialect, by, hint, params), read)
    # --by gpu-model: each attempt's wait (None if it has none), read with the groups'.
    seen: dict[Any, float | None] | None = {} if want_seen else None
    _place_waits(fetch, by, groups, found, seen)
    rows = list(groups.values())
    if not with_total:
        return rows, None
    if by is None:
        return [], rows[0] if rows else UsageGroup(())
    if found.window is not None:
        window = found.window
        assert seen is not None
        if len(seen) == window.attempts:  # the groups held every attempt of the window
            window.waits = sorted(w for w in seen.values() if w is not None)
        elif window.attempts:  # one is in no group (a recorded list without models): read them all
            _waits(fetch, dialect, None, hint, params, {(): window}, None)
        return rows, window
    return rows, _total(rows, by, found.window_frames)


def _window_frames_sql(d: Dialect, hint: str) -> str:
    return f"SELECT COUNT(DISTINCT a.frame_id) FROM attempts a {hint} WHERE {_window(d, 'a')}"


A = TypeVar("A")
B = TypeVar("B")


def _alongside(first: Callable[[], A], second: Callable[[], B]) -> tuple[A, B]:
    """``first()`` here while ``second()`` runs on a thread of its own (the database works
    without the GIL, so the two queries take both cores); the first error raised wins."""
    done: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            done.append((True, second()))
        except BaseException as exc:  # handed to the caller below
            done.append((False, exc))

    thread = threading.Thread(target=run, name="cuectl-report-waits", daemon=True)
    thread.start()
    try:
        result = first()
    finally:
        thread.join()  # never leave the thread reading a connection the caller closes
    ok, value = done[0]
    if not ok:
        raise value
    return result, value


def _sums(
    fetch: Fetch, dialect: Dialect, by: str | None, hint: str, params: Mapping[str, Any]
) -> dict[tuple, UsageGroup]:
    """One group per key, its sums filled in and its waits still empty."""
    base, nkeys = _base(by, dialect, hint)
    groups: dict[tuple, UsageGroup] = {}
    for row in fetch(_sums_sql(base, nkeys), params):
        key = tuple(row[:nkeys])
        (frames, attempts, succeeded, retries, dead, wall, cores, alloc, busy, util_w, util_n, mem, idle) = row[nkeys:]
        groups[key] = UsageGroup(
            key,
            int(frames),
            int(attempts),
            int(succeeded),
            int(retries),
            int(dead),
            float(wall or 0),
            float(cores or 0),
            float(alloc or 0),
            float(busy or 0),
            float(util_w or 0),
            float(util_n or 0),
            None if mem is None else int(mem),
            gpu_seconds_idle=float(idle or 0),
        )
    return groups


# Groupings whose key is a function of the job alone: their waits are read keyed by job id,
# without the join, and each job's list goes to its group afterwards (a farm's window has
# far fewer jobs than attempts).
_BY_JOB = {"job": "j.id, j.name", "user": 'j.id, j."user"', "project": "j.id, j.project", "show": "j.id, j.show"}
_WAIT = (
    "CASE WHEN a.waiting_since IS NULL OR a.started_at IS NULL THEN NULL WHEN a.started_at > a.waiting_since "
    "THEN a.started_at - a.waiting_since ELSE 0.0 END"
)


@dataclass
class _AsideRead:
    """What summarise reads beside the sums, before it goes to the groups. The waits:
    ``keyed`` by job id, (job id, layer id) or the group's key; --by gpu-model's
    recorded-model attempts as (attempt id, wait) by their list of models, with each list's
    models; ``seen`` the other attempts' (attempt id, wait), kept only for --by gpu-model's
    window total. And the window's own figures where the groups cannot give them: --by
    gpu-model's ``window`` sums, or the distinct frames of a grouping that can hold a frame
    twice (``window_frames``: host, day)."""

    keyed: dict[Any, list[float]] = field(default_factory=dict)
    by_list: dict[Any, list[tuple[Any, float | None]]] = field(default_factory=dict)
    models: dict[Any, list[Any]] = field(default_factory=dict)
    seen: list[tuple[Any, float | None]] = field(default_factory=list)
    window: UsageGroup | None = None
    window_frames: int = 0


def _waits(
    fetch: Fetch,
    dialect: Dialect,
    by: str | None,
    hint: str,
    params: Mapping[str, Any],
    groups: dict[tuple, UsageGroup],
    seen: dict[Any, float | None] | None,
) -> None:
    """Fill in each group's queue waits, sorted. ``seen`` (--by gpu-model only) gets the
    id and wait (None when it has none) of each attempt the groups hold, once."""
    _place_waits(fetch, by, groups, _read_waits(fetch, dialect, by, hint, params, seen is not None), seen)


def _read_waits(
    fetch: Fetch, dialect: Dialect, by: str | None, hint: str, params: Mapping[str, Any], want_seen: bool
) -> _AsideRead:
    """The waits of the window's attempts, one row each: the heavy half, which needs no
    group (so it can run beside the sums)."""
    window = _window(dialect, "a")
    found = _AsideRead()
    keyed = found.keyed
    if by in _BY_JOB or by == "layer":
        # Keyed by ids without the joins the names need; the ids are named afterwards.
        layer = ", f.layer_id" if by == "layer" else ""
        join = " JOIN frames f ON f.id = a.frame_id" if by == "layer" else ""
        for *ids, value in fetch(
            f"SELECT a.job_id{layer}, {_WAIT} AS wait FROM attempts a {hint}{join} "
            f"WHERE {window} AND a.waiting_since IS NOT NULL AND a.started_at IS NOT NULL",
            params,
        ):
            key = tuple(ids) if by == "layer" else ids[0]
            values = keyed.get(key)
            if values is None:
                keyed[key] = [float(value)]
            else:
                values.append(float(value))
        return found
    nkeys = _nkeys(by)
    if by == "gpu-model":
        _read_recorded_model_waits(fetch, dialect, hint, params, found)
    waits, _ = _base(by, dialect, hint, waits_only=True, recorded=by != "gpu-model")
    keys = "".join(f"k{i}, " for i in range(nkeys))
    where = "" if want_seen else " WHERE wait IS NOT NULL"
    for row in fetch(f"SELECT {keys}wait, aid FROM ({waits}) t{where}", params):
        value = row[nkeys]
        if value is not None:
            value = float(value)
            key = tuple(row[:nkeys])
            values = keyed.get(key)
            if values is None:
                keyed[key] = [value]
            else:
                values.append(value)
        if want_seen:
            found.seen.append((row[nkeys + 1], value))
    return found


def _place_waits(
    fetch: Fetch,
    by: str | None,
    groups: dict[tuple, UsageGroup],
    found: _AsideRead,
    seen: dict[Any, float | None] | None,
) -> None:
    """Each group's waits from what ``_read_waits`` found, sorted (names looked up here)."""
    if by in _BY_JOB:
        if found.keyed:
            ids = ", ".join(str(int(job_id)) for job_id in found.keyed)  # integers read from the store itself
            for job_id, *key in fetch(f"SELECT {_BY_JOB[by]} FROM jobs j WHERE j.id IN ({ids})", {}):
                group = groups.get((job_id, key[0]) if by == "job" else (key[0],))
                if group is not None:
                    group.waits.extend(found.keyed[job_id])
    elif by == "layer":  # named by (job id, layer id): one join, not three
        if found.keyed:
            jobs = _names(fetch, "jobs", {job_id for job_id, _ in found.keyed})
            layers = _names(fetch, "layers", {layer_id for _, layer_id in found.keyed})
            for (job_id, layer_id), values in found.keyed.items():
                if job_id in jobs and layer_id in layers:
                    group = groups.get((jobs[job_id], layers[layer_id]))
                    if group is not None:
                        group.waits.extend(values)
    else:
        for text, pairs in found.by_list.items():
            of = [groups[(model,)] for model in found.models.get(text, ())]
            if not of:  # a list without models ('[]'): in no group, as in the sums
                continue
            for aid, value in pairs:
                if value is not None:
                    for group in of:
                        group.waits.append(value)
                if seen is not None:
                    seen[aid] = value
        for key, values in found.keyed.items():
            groups[key].waits.extend(values)
        if seen is not None:
            seen.update(found.seen)
    for group in groups.values():
        group.waits.sort()


def _names(fetch: Fetch, table: str, ids: set[Any]) -> dict[Any, Any]:
    """``name`` by ``id`` of those rows of ``table`` (jobs, layers)."""
    listed = ", ".join(str(int(i)) for i in ids if i is not None)  # integers read from the store itself
    if not listed:
        return {}
    return {row[0]: row[1] for row in fetch(f"SELECT id, name FROM {table} WHERE id IN ({listed})", {})}


def _read_recorded_model_waits(
    fetch: Fetch, d: Dialect, hint: str, params: Mapping[str, Any], found: _AsideRead
) -> None:
    """--by gpu-model's waits of the attempts with recorded models, read once per attempt
    with its list of models (not once per model, nor joined to the lists): each distinct
    list's models come from the database (the same rows _source joins), and each wait goes
    to each of its list's models when placed."""
    window = _window(d, "a2")
    lists = f"SELECT DISTINCT a2.gpu_models FROM attempts a2 {hint} WHERE {window} AND a2.gpu_models IS NOT NULL"
    for text, model in fetch(
        f"SELECT DISTINCT x.gpu_models, e.value FROM ({lists}) x, {d.each('x.gpu_models')}", params
    ):
        found.models.setdefault(text, []).append(model)
    by_list = found.by_list
    for text, value, aid in fetch(
        f"SELECT a.gpu_models, {_WAIT}, a.id FROM attempts a {hint} "
        f"WHERE {_window(d, 'a')} AND a.gpu_models IS NOT NULL",
        params,
    ):
        pair = (aid, None if value is None else float(value))
        pairs = by_list.get(text)
        if pairs is None:
            by_list[text] = [pair]
        else:
            pairs.append(pair)


def _nkeys(by: str | None) -> int:
    return len(_KEYS[by]) if by != "gpu-model" else 1


def _total(rows: list[UsageGroup], by: str, window_frames: int) -> UsageGroup:
    """Every other grouping puts each attempt in exactly one group, so the window's sums are
    the groups' sums. Distinct frames add up only where a frame cannot be in two groups;
    elsewhere (a frame retried on another host is in two host groups) they are
    ``window_frames``, counted by the database."""
    total = UsageGroup(())
    for row in rows:
        for name in (
            "attempts",
            "succeeded",
            "retries",
            "dead",
            "wall_seconds",
            "core_seconds",
            "gpu_seconds_allocated",
            "gpu_seconds_busy",
            "util_weighted",
            "util_weight",
            "gpu_seconds_idle",
        ):
            setattr(total, name, getattr(total, name) + getattr(row, name))
        if row.gpu_memory_peak_bytes is not None:
            total.gpu_memory_peak_bytes = max(total.gpu_memory_peak_bytes or 0, row.gpu_memory_peak_bytes)
        total.waits.extend(row.waits)
    total.waits.sort()
    total.frames = sum(row.frames for row in rows) if by in FRAME_PARTITIONS else window_frames
    return total
