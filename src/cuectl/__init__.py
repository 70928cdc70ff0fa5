"""cuectl: a GPU-aware job queue (jobs -> layers -> frames) for workstations and farms.

The package root stays import-light so that ``cuectl --version`` is quick: heavy modules
(typer, rich, pynvml, yaml, psycopg) are imported where they are used.
"""

__version__ = "0.1.0"

__all__ = ["Job", "JobsFailed", "WaitTimeout", "__version__", "async_lease", "lease", "submit", "submit_all", "wait"]

# Not ``typing.TYPE_CHECKING``: importing typing alone would triple the cost of ``import cuectl``.
# Type checkers treat any name TYPE_CHECKING as true; at run time these load on first use.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cuectl.api import Job, submit, submit_all, wait
    from cuectl.sched.wait import JobsFailed, WaitTimeout


def __getattr__(name: str) -> "Any":
    value = _load(name)
    # Kept as a real attribute: ``cuectl.lease`` in a loop then skips this function (a few
    # µs of every lease otherwise).
    globals()[name] = value
    return value


def _load(name: str) -> "Any":
    # ``cuectl.lease`` is the public ad-hoc lease API; load it lazily so that importing
    # cuectl for the CLI does not pull in the lease machinery.
    if name in ("lease", "async_lease"):
        from cuectl.run import lease as leases

        return getattr(leases, name)
    # The submission API (docs/python-api.md): cuectl.api itself is light; the store, spec
    # validation and PyYAML load only when a job is submitted or waited for.
    if name in ("submit", "submit_all", "wait", "Job"):
        from cuectl import api

        return getattr(api, name)
    if name in ("WaitTimeout", "JobsFailed"):
        from cuectl.sched import wait as waits

        return getattr(waits, name)
    raise AttributeError(name)
