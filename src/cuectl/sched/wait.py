"""Waiting for jobs to finish (``cuectl job wait``): in the library, so a script or the
Python API waits by the same rule as the command.

A job is finished when none of its frames is WAITING, DEPEND or RUNNING (the store's
``state`` FINISHED); it *succeeded* when its ``outcome`` is SUCCEEDED (every frame succeeded
or was eaten), and failed when it is FAILED (DEAD frames) or KILLED.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from cuectl.errors import Conflict, CuectlError, InvalidInput, NotFound
from cuectl.sched import model as m
from cuectl.sched.store import Store


class WaitTimeout(CuectlError):
    """The jobs did not finish within the time given."""


class JobsFailed(CuectlError):
    """Some of the jobs waited for finished without succeeding."""


class UnknownJob(NotFound):
    """A job to wait for does not exist, or its name is several jobs': bad input (exit 2),
    never the status of a job that
    failed (1), so that ``job wait $ID || page-oncall`` does not page for a typo."""

    exit_code = 2


def wait_jobs(
    store: Store,
    refs: Sequence[str | int],
    *,
    timeout_s: float | None = None,
    poll_s: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[dict[str, Any]]:
    """Block until every job of ``refs`` is finished; return them (``get_job`` shapes).
    Raises ``UnknownJob`` (a ``NotFound``, exit status 2) at once for an unknown job and
    ``WaitTimeout`` after ``timeout_s``."""
    if not refs:
        raise InvalidInput("give at least one job (id or name)")
    if poll_s <= 0:
        raise InvalidInput(f"--poll: must be more than 0, got {poll_s:g}")
    ids = list(dict.fromkeys(_job_id(store, ref) for ref in refs))
    deadline = None if timeout_s is None else clock() + timeout_s
    while True:
        jobs = [store.get_job(job_id) for job_id in ids]
        waiting = [j for j in jobs if j["state"] != m.JOB_FINISHED]
        if not waiting:
            return jobs
        if deadline is not None and clock() >= deadline:
            names = ", ".join(f"{j['id']} {j['name']}" for j in waiting)
            raise WaitTimeout(f"timed out after {timeout_s:g} s; still running: {names}")
        sleep(poll_s if deadline is None else max(0.0, min(poll_s, deadline - clock())))


def _job_id(store: Store, ref: str | int) -> int:
    """The job ``ref`` names; a name that names none, or several, is bad input (exit 2):
    `job wait NAME || page-oncall` must not page for a typo."""
    try:
        return int(store.get_job(ref)["id"])
    except (NotFound, Conflict) as exc:
        raise UnknownJob(exc.message, hint=exc.hint) from None


def check_succeeded(jobs: Sequence[dict[str, Any]]) -> None:
    """``JobsFailed`` naming each finished job that did not succeed (FAILED or KILLED)."""
    failed = [j for j in jobs if j.get("outcome") != "SUCCEEDED"]
    if failed:
        named = ", ".join(f"{j['id']} {j['name']} {j.get('outcome')}" + _dead(j) for j in failed)
        raise JobsFailed(
            f"{len(failed)} of {len(jobs)} job(s) did not succeed: {named}",
            hint="`cuectl frame list --job JOB --state DEAD` lists the failed frames",
        )


def _dead(job: dict[str, Any]) -> str:
    dead = (job.get("frame_counts") or {}).get(m.DEAD, 0)
    why = f": {job['outcome_reason']}" if job.get("outcome_reason") else ""  # who killed frames, how many failed
    return f" ({dead} DEAD frame{'s' if dead != 1 else ''}{why})" if dead else ""
