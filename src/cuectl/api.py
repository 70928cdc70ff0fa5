"""The Python submission API: ``cuectl.submit``, the ``cuectl.Job`` builder and ``cuectl.wait``.

A script submits exactly what ``cuectl submit`` would: every form goes through the same
front door (``cuectl.sched.intake``: a spec file in any format the CLI reads, YAML or JSON,
an Open Job Description template, an OpenCue XML spec) and is validated by
``cuectl.sched.spec.spec_from_mapping`` (the YAML schema of docs/job-spec.md), errors are
``cuectl.errors.InvalidInput`` naming the field (``layers[0].gpus: must be 0 or more``), and
nothing is written (not even a new store file) unless the whole spec is valid. The job's
user is the submitting user, as for the CLI (``CUECTL_USER``, else the login name). The
store is ``db`` if given, else the CLI's default (``CUECTL_DB``, else your own SQLite store).

Everything heavy (the store, spec validation, PyYAML) is imported inside the functions, so
``import cuectl`` stays cheap. Tutorial: docs/python-api.md.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence, Union

from cuectl.errors import InvalidInput

if TYPE_CHECKING:
    from cuectl.sched.model import JobSpec
    from cuectl.sched.store import Store

__all__ = ["Job", "build_spec", "build_specs", "submit", "submit_all", "wait"]

#: What ``depends=`` takes: one layer name, or a list of layer names and
#: ``{"layer": NAME, "type": "layer" | "frame"}`` mappings (as in YAML).
Depends = Union[str, Sequence[Union[str, Mapping[str, str]]]]


class Job:
    """A job spec built in Python; ``.to_spec()`` is the same mapping a YAML file holds.

    >>> job = (cuectl.Job("sweep-lr", priority=10)
    ...        .layer("train", ["python", "train.py", "--seed", "#IFRAME#"], range="1-8", gpus=1,
    ...               gpu_vendor="NVIDIA", gpu_memory_min="24G")
    ...        .layer("report", "python report.py", depends="train"))
    >>> job_id = job.submit()

    Nothing is checked while building: ``submit()`` validates the whole job at once, as
    ``cuectl submit job.yaml`` does, so errors name the field as in a YAML file.
    """

    def __init__(
        self,
        name: str,
        *,
        priority: int = 0,
        paused: bool = False,
        env: Mapping[str, str] | None = None,
        project: str | None = None,
        max_running: int | None = None,
        max_cores: float | None = None,
        max_gpus: int | None = None,
        show: str | None = None,
        shot: str | None = None,
    ) -> None:
        self.name = name
        self.priority = priority
        self.paused = paused
        self.env: dict[str, Any] | None = dict(env) if env is not None else None
        # The job's project label and caps (docs/scheduling.md); None: not set.
        self.caps: dict[str, Any] = {
            key: value
            for key, value in (
                ("project", project),
                ("max_running", max_running),
                ("max_cores", max_cores),
                ("max_gpus", max_gpus),
                ("show", show),
                ("shot", shot),
            )
            if value is not None
        }
        self.layers: list[dict[str, Any]] = []

    def layer(
        self,
        name: str,
        command: Sequence[str] | str,
        *,
        range: str | int = "1",  # noqa: A002 - the spec's key is range
        chunk: int = 1,
        gpus: int | None = None,
        gpu_vendor: str | None = None,
        gpu_models: Sequence[str] | str = (),
        gpu_memory_min: str | int | None = None,
        gpu_capability_min: str | float | None = None,
        gpu_driver_min: str | float | None = None,
        gpu_cuda_min: str | float | None = None,
        cores: float | None = None,
        memory: str | int | None = None,
        retries: int | None = None,
        timeout: str | float | None = None,
        env: Mapping[str, str] | None = None,
        tags: Sequence[str] = (),
        depends: Depends | None = None,
        max_running: int | None = None,
        limits: Sequence[str] | str = (),
        retry_delay: str | float | None = None,
        service: str | Sequence[str] | None = None,
        retry_on_gpu_oom: str | None = None,
        gpu_escape: str | None = None,
        gpu_idle_limit: str | float | None = None,
        gpu_idle_action: str | None = None,
        gpu_idle_util: float | None = None,
        gpu_share: str | int | None = None,
        gpu_share_enforce: str | None = None,
    ) -> Job:
        """Add a layer (the keys of docs/job-spec.md) and return the job, for chaining.

        ``command``: a list is argv, run as is; a string runs through ``/bin/sh -c``.
        Sizes (``memory``, ``gpu_memory_min``) are strings like ``"8G"``; a bare number is
        MiB, as in YAML. ``gpu_capability_min``, ``gpu_driver_min``, ``gpu_cuda_min``: dotted
        versions each device must meet (``"8.9"``, ``"535.104.05"``). ``timeout`` is a duration (``"2h"``) or seconds. ``service``: the
        service whose defaults fill what the layer leaves out (a list: the first the store
        has); ``gpus`` left out is then the service's count."""
        layer: dict[str, Any] = {
            "name": name,
            "command": command if isinstance(command, str) else list(command),
            "range": range,
            "chunk": chunk,
        }
        if gpus is not None or (service is None and gpu_share is None):
            # left out: the service's count (cuectl admin service); with a share, one GPU
            layer["gpus"] = 0 if gpus is None else gpus
        optional: dict[str, Any] = {
            "gpu_vendor": gpu_vendor,
            "gpu_models": ([gpu_models] if isinstance(gpu_models, str) else list(gpu_models)) or None,
            "gpu_memory_min": gpu_memory_min,
            "gpu_capability_min": gpu_capability_min,
            "gpu_driver_min": gpu_driver_min,
            "gpu_cuda_min": gpu_cuda_min,
            "cores": cores,
            "memory": memory,
            "retries": retries,
            "timeout": timeout,
            "env": dict(env) if env is not None else None,
            "tags": ([tags] if isinstance(tags, str) else list(tags)) or None,
            "depends": _depends(depends),
            "max_running": max_running,
            "limits": ([limits] if isinstance(limits, str) else list(limits)) or None,
            "retry_delay": retry_delay,
            "retry_on_gpu_oom": retry_on_gpu_oom,
            "gpu_escape": gpu_escape,
            "gpu_idle_limit": gpu_idle_limit,
            "gpu_idle_action": gpu_idle_action,
            "gpu_idle_util": gpu_idle_util,
            "gpu_share": gpu_share,
            "gpu_share_enforce": gpu_share_enforce,
            "service": service if service is None or isinstance(service, str) else list(service),
        }
        layer.update({key: value for key, value in optional.items() if value is not None})
        self.layers.append(layer)
        return self

    def to_spec(self) -> dict[str, Any]:
        """The job as a mapping in the YAML spec's schema (a fresh copy each call)."""
        spec: dict[str, Any] = {"name": self.name, "priority": self.priority, "paused": self.paused, **self.caps}
        if self.env is not None:
            spec["env"] = dict(self.env)
        spec["layers"] = [_copy_layer(layer) for layer in self.layers]
        return spec

    def submit(self, db: str | None = None) -> int:
        """Validate and submit the job; return its id (see ``cuectl.submit``)."""
        return submit(self, db=db)

    def __repr__(self) -> str:
        names = ", ".join(str(layer.get("name")) for layer in self.layers)
        return f"Job({self.name!r}, layers=[{names}])"


def _depends(depends: Depends | None) -> list[Any] | None:
    if depends is None:
        return None
    if isinstance(depends, str):
        return [depends]
    return [dict(item) if isinstance(item, Mapping) else item for item in depends]


def _copy_layer(layer: Mapping[str, Any]) -> dict[str, Any]:
    return {
        key: (list(value) if isinstance(value, list) else dict(value) if isinstance(value, dict) else value)
        for key, value in layer.items()
    }


def build_spec(
    spec: Mapping[str, Any] | str | Path | Job, *, params: Sequence[str] | Mapping[str, str] = (), strict: bool = False
) -> JobSpec:
    """Validate ``spec`` into a ``JobSpec`` exactly as ``cuectl submit`` does, without
    touching any store: a mapping (the YAML schema, or an Open Job Description template),
    a path to a spec file in any format ``cuectl submit`` reads (YAML or JSON, an Open Job
    Description template, an OpenCue ``.xml`` spec; ``-``: standard input), or a ``Job``.
    ``params``: a template's job parameters (``{"Frames": "1-10"}`` or ``NAME=VALUE``
    items, as ``--param``); ``strict``: anything cuectl cannot honour is an error (else a
    ``UserWarning``, as the CLI's warning). An OpenCue spec of several jobs: ``build_specs``."""
    return _loaded(spec, params, strict).one(
        hint="cuectl.api.build_specs returns them all, cuectl.api.submit_all submits them all"
    )


def build_specs(
    spec: Mapping[str, Any] | str | Path | Job, *, params: Sequence[str] | Mapping[str, str] = (), strict: bool = False
) -> list[JobSpec]:
    """Every job of ``spec`` (see ``build_spec``), validated, in submit order: one, or the
    jobs of an OpenCue spec."""
    return list(_loaded(spec, params, strict).jobs)


def _loaded(spec: Mapping[str, Any] | str | Path | Job, params: Sequence[str] | Mapping[str, str], strict: bool) -> Any:
    """``spec`` through the front door every submit takes (cuectl.sched.intake), with the
    context ``cuectl submit`` captures: the user, the frame limit, the directory and environment."""
    import warnings

    from cuectl.sched import intake

    context = intake.SubmitContext.here()

    def warn(note: str) -> None:
        warnings.warn(note, UserWarning, stacklevel=4)

    if isinstance(spec, (str, Path)):
        return intake.load(intake.read_source(spec), context, params=params, strict=strict, warn=warn)
    if isinstance(spec, Job):
        spec = spec.to_spec()
    if isinstance(spec, Mapping):
        notes: list[str] = []
        job_spec = intake.load_mapping(spec, context, params=params, notes=notes)
        if strict and notes:
            raise InvalidInput(
                f"{len(notes)} thing(s) cannot be honoured: " + "; ".join(notes),
                hint="strict=False to submit anyway (each is a warning then)",
            )
        for note in notes:
            warn(note)
        return intake.Loaded((job_spec,), intake.SPEC, "<mapping>", ((),), tuple(notes))
    raise InvalidInput(
        f"submit: expected a mapping, a path to a job spec file or a cuectl.Job, got {type(spec).__name__}"
    )


def _open(db: str | Path | None, *, create: bool) -> Store:
    from cuectl import config
    from cuectl.sched.store import open_store

    return open_store(
        str(db) if db is not None else config.default_db_url(), busy_timeout_s=config.busy_timeout(), create=create
    )


def submit(
    spec: Mapping[str, Any] | str | Path | Job,
    *,
    db: str | Path | None = None,
    params: Sequence[str] | Mapping[str, str] = (),
    strict: bool = False,
) -> int:
    """Submit a job and return its id.

    ``spec``: a mapping in the YAML spec's schema (docs/job-spec.md) or an Open Job
    Description template, a path to a spec file (``str`` or ``Path``: YAML or JSON, an
    OpenJD template, an OpenCue ``.xml`` spec of one job — ``submit_all`` for several), or
    a ``cuectl.Job``. ``params``, ``strict``: as for ``build_spec``. ``db``: a store path or
    URL (``sqlite:///…``, ``postgresql://…``); default ``CUECTL_DB``, else your own SQLite
    store, created if missing (as ``cuectl submit`` does). Raises ``InvalidInput`` naming
    the field before anything is written; ``StoreError`` if the store cannot be used.
    """
    loaded = _loaded(spec, params, strict)  # validate first: a bad spec creates no store
    loaded.one(hint="cuectl.api.submit_all submits every job of the spec")
    return _submit_loaded(loaded, db)[0]


def submit_all(
    spec: Mapping[str, Any] | str | Path | Job,
    *,
    db: str | Path | None = None,
    params: Sequence[str] | Mapping[str, str] = (),
    strict: bool = False,
) -> list[int]:
    """Submit every job of ``spec`` (see ``submit``) and return their ids, in submit order:
    an OpenCue spec's jobs as ``cuectl submit job.xml`` submits them (each after the jobs
    it waits on, with its frame-level waits)."""
    return _submit_loaded(_loaded(spec, params, strict), db)


def _submit_loaded(loaded: Any, db: str | Path | None) -> list[int]:
    import warnings

    from cuectl.sched import intake

    store = _open(db, create=True)
    try:
        return intake.submit(
            store, loaded, now=time.time(), warn=lambda text: warnings.warn(text, UserWarning, stacklevel=4)
        )
    finally:
        store.close()


def wait(
    jobs: int | str | Sequence[int | str],
    *,
    timeout: str | float | None = None,
    db: str | Path | None = None,
    poll: float = 1.0,
    check: bool = True,
) -> list[dict[str, Any]]:
    """Block until the jobs (ids or unique names) finish, as ``cuectl job wait`` does.

    Returns the finished jobs (``cuectl job show --json`` shapes, without the pending reason
    detail). Raises ``NotFound`` at once for an unknown job, ``WaitTimeout`` after
    ``timeout`` (seconds or a duration like ``"2h"``), and, with ``check`` (the default),
    ``JobsFailed`` if any job has DEAD frames or was killed.
    """
    from cuectl.sched.wait import check_succeeded, wait_jobs
    from cuectl.units import parse_duration

    refs: list[int | str] = [jobs] if isinstance(jobs, (int, str)) else list(jobs)
    limit = None if timeout is None else parse_duration(timeout, field="timeout")
    store = _open(db, create=False)
    try:
        done = wait_jobs(store, refs, timeout_s=limit, poll_s=poll)
    finally:
        store.close()
    if check:
        check_succeeded(done)
    return done
