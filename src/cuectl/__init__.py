"""cuectl: a GPU-aware job queue (jobs -> layers -> frames) for workstations and farms.

The package root stays import-light so that ``cuectl --version`` is quick: heavy modules
(typer, rich, pynvml, yaml, psycopg) are imported where they are used.
"""

__version__ = "0.1.0"

__all__ = ["__version__", "async_lease", "lease"]


def __getattr__(name: str):
    # ``cuectl.lease`` is the public ad-hoc lease API; load it lazily so that importing
    # cuectl for the CLI does not pull in the lease machinery.
    if name in ("lease", "async_lease"):
        from cuectl.run import lease as leases

        return getattr(leases, name)
    raise AttributeError(name)
