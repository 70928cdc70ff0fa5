"""Caps on what runs at once: per layer and job (``max_running``, ``max_cores``,
``max_gpus``), named limits shared across jobs (a licence pool), and quotas per user and
project (docs/scheduling.md).

A claim checks every cap that applies to its layer inside the claim statement itself, as
one more condition of the same ``UPDATE`` (``claim_condition``): on SQLite that statement
runs under the store's one write lock, so two claimers can never both take the last slot.
On PostgreSQL concurrent statements do not see each other's rows, so a capped claim first
takes a transaction-scoped advisory lock per cap (``lock_keys``, sorted: no deadlocks);
claims of uncapped layers stay the lock-free single statement they were.

Each cap is "what is in use now + what this frame adds <= the cap". ``explain`` evaluates
the same expressions to say which cap holds a layer back, for pending reasons and
``cuectl job why``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

#: A cap's SQL reads RUNNING frames only; every one has a frames_layer_state or
#: frames_running_job index to use.
_LAYER_RUNNING = "SELECT COUNT(*) FROM frames r WHERE r.layer_id = ? AND r.state = 'RUNNING'"
_JOB_RUNNING = "SELECT COUNT(*) FROM frames r WHERE r.job_id = ? AND r.state = 'RUNNING'"
_JOB_SUM = (
    "SELECT COALESCE(SUM(rl.{column}), 0) FROM frames r JOIN layers rl ON rl.id = r.layer_id "
    "WHERE r.job_id = ? AND r.state = 'RUNNING'"
)
_LIMIT_RUNNING = (
    "SELECT COUNT(*) FROM layer_limits ll JOIN frames r ON r.layer_id = ll.layer_id "
    "WHERE ll.name = ? AND r.state = 'RUNNING'"
)
_OWNER_SUM = (
    "SELECT COALESCE(SUM(rl.{column}), 0) FROM frames r JOIN jobs rj ON rj.id = r.job_id "
    "JOIN layers rl ON rl.id = r.layer_id WHERE rj.{owner} = ? AND r.state = 'RUNNING'"
)

QUOTA_KINDS = ("user", "project")


@dataclass(frozen=True)
class Cap:
    """One cap that applies to a claim: ``(used) + adds <= limit`` must hold."""

    key: str  # names the cap (and its PostgreSQL advisory lock)
    label: str  # "the job's max_gpus", "limit 'nuke'", "user ada's GPU quota"
    unit: str  # "running", "GPUs", "cores"
    used_sql: str
    used_params: tuple[Any, ...]
    adds: float
    limit: float


@dataclass(frozen=True)
class Quota:
    kind: str  # user | project
    name: str
    max_gpus: int | None
    max_cores: float | None

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "max_gpus": self.max_gpus, "max_cores": self.max_cores}


def check_limit(name: str, max_running: int | None) -> str:
    """A limit's name and N as ``admin limit set NAME N`` takes them (InvalidInput else)."""
    from cuectl.sched.checks import label_name
    from cuectl.sched.fields import whole_number

    name = label_name(name, "NAME", "limit")
    if max_running is not None:
        whole_number(max_running, "N", minimum=0, maximum=1_000_000)
    return name


def check_quota(kind: str, name: str, max_gpus: int | None, max_cores: float | None, *, delete: bool = False) -> str:
    """A quota as ``admin quota set KIND NAME --gpus N --cores N`` takes it (InvalidInput else)."""
    from cuectl.errors import InvalidInput
    from cuectl.sched.checks import label_name
    from cuectl.sched.fields import whole_number

    if kind not in QUOTA_KINDS:
        raise InvalidInput(f"KIND: {kind!r} is not one of {', '.join(QUOTA_KINDS)}")
    if kind == "project":
        name = label_name(name, "NAME", "project")
    elif not name or not name.strip() or len(name) > 200 or not name.isprintable():
        raise InvalidInput(f"NAME: {name!r} is not a user name")
    if max_gpus is not None:
        whole_number(max_gpus, "--gpus", minimum=0, maximum=1_000_000)
    if max_cores is not None and not (max_cores >= 0 and max_cores < 1e9):
        raise InvalidInput("--cores: must be 0 or more")
    if not delete and max_gpus is None and max_cores is None:
        raise InvalidInput(
            "give --gpus and/or --cores", hint="`cuectl admin quota delete user|project NAME` removes a quota"
        )
    return name


def caps_for(layer: Mapping[str, Any], limits: Mapping[str, int], quotas: Mapping[tuple[str, str], Quota]) -> list[Cap]:
    """Every cap a frame of ``layer`` (a layer row with its job's columns, as the claim
    path reads it) must fit under. ``limits``: name -> max running; ``quotas`` by (kind, name)."""
    caps: list[Cap] = []
    gpus, cores = int(layer["gpus"]), float(layer["cores"])
    if layer["max_running"] is not None:
        caps.append(
            Cap(
                f"layer:{layer['id']}",
                "the layer's max_running",
                "running",
                _LAYER_RUNNING,
                (layer["id"],),
                1,
                layer["max_running"],
            )
        )
    job = layer["job_id"]
    if layer["job_max_running"] is not None:
        caps.append(
            Cap(f"job:{job}", "the job's max_running", "running", _JOB_RUNNING, (job,), 1, layer["job_max_running"])
        )
    if layer["job_max_gpus"] is not None and gpus > 0:
        caps.append(
            Cap(
                f"job:{job}",
                "the job's max_gpus",
                "GPUs",
                _JOB_SUM.format(column="gpus"),
                (job,),
                gpus,
                layer["job_max_gpus"],
            )
        )
    if layer["job_max_cores"] is not None:
        caps.append(
            Cap(
                f"job:{job}",
                "the job's max_cores",
                "cores",
                _JOB_SUM.format(column="cores"),
                (job,),
                cores,
                layer["job_max_cores"],
            )
        )
    for name in sorted(_names(layer["limits"])):
        if name in limits:
            caps.append(Cap(f"limit:{name}", f"limit '{name}'", "running", _LIMIT_RUNNING, (name,), 1, limits[name]))
    for kind, owner in (("user", layer["user"]), ("project", layer["project"])):
        quota = quotas.get((kind, owner)) if owner is not None else None
        if quota is None:
            continue
        column = '"user"' if kind == "user" else "project"
        whose = f"{kind} {owner}'s"
        if quota.max_gpus is not None and gpus > 0:
            caps.append(
                Cap(
                    f"{kind}:{owner}",
                    f"{whose} GPU quota",
                    "GPUs",
                    _OWNER_SUM.format(column="gpus", owner=column),
                    (owner,),
                    gpus,
                    quota.max_gpus,
                )
            )
        if quota.max_cores is not None:
            caps.append(
                Cap(
                    f"{kind}:{owner}",
                    f"{whose} core quota",
                    "cores",
                    _OWNER_SUM.format(column="cores", owner=column),
                    (owner,),
                    cores,
                    quota.max_cores,
                )
            )
    return caps


def _names(value: Any) -> list[str]:
    import json

    if isinstance(value, str):
        value = json.loads(value or "[]")
    return [str(v) for v in value or ()]


def claim_condition(caps: Sequence[Cap]) -> tuple[str, tuple[Any, ...]]:
    """The SQL that holds while every cap has room for one more frame, and its parameters
    (``""`` for none): appended to the claim's WHERE with AND."""
    parts, params = [], []
    for cap in caps:
        parts.append(f"({cap.used_sql}) + ? <= ?")
        params += [*cap.used_params, cap.adds, cap.limit]
    return " AND ".join(parts), tuple(params)


def lock_keys(caps: Sequence[Cap]) -> list[int]:
    """PostgreSQL advisory lock ids of the caps, sorted and distinct: 64-bit signed
    integers from the caps' keys, so unrelated caps rarely share a lock (sharing one only
    serialises two claims, it never lets a cap be exceeded)."""
    ids = {
        int.from_bytes(hashlib.sha256(f"cuectl-cap:{c.key}".encode()).digest()[:8], "big", signed=True) for c in caps
    }
    return sorted(ids)


def explain(caps: Sequence[Cap], read: Callable[[str, Sequence[Any]], Any]) -> str | None:
    """The first cap with no room for one more frame, as ``the job's max_gpus: 4 of 4 GPUs
    in use (a frame needs 2)``; None when every cap has room. ``read(sql, params)`` returns
    the single value of a one-row, one-column query."""
    for cap in caps:
        used = float(read(cap.used_sql, cap.used_params) or 0)
        if used + cap.adds > cap.limit + 1e-9:
            need = f" (a frame needs {cap.adds:g})" if cap.unit != "running" else ""
            verb = "running" if cap.unit == "running" else f"{cap.unit} in use"
            return f"{cap.label} reached: {used:g} of {cap.limit:g} {verb}{need}"
    return None
