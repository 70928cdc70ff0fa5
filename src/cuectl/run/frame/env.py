"""The frame environment: what one frame attempt is (:class:`FrameContext`, its OpenCue
name) and the variables it runs with (:func:`frame_env`; :func:`env_template`: all of it
but the frame's own values, made once per layer and set of devices), with the worker's own
store credentials and inherited ``CUE_*`` variables filtered out."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from cuectl import config
from cuectl.errors import InvalidInput

__all__ = ["EnvTemplate", "FrameBase", "FrameContext", "env_template", "frame_base", "frame_env", "frame_name"]


@dataclass(frozen=True)
class FrameContext:
    """Everything about one frame attempt that ends up in its command line or environment."""

    job: str
    job_id: str
    layer: str
    layer_id: str
    frame_id: str
    frame_number: int  # first frame of the chunk
    frames: tuple[int, ...]  # the chunk's frames, in dispatch order
    layer_range: str
    chunk: int
    attempt: int  # 1-based
    cores: float
    memory_bytes: int
    # Per-device memory granted (each granted device's total, or the request): CUE_GPU_MEMORY.
    gpu_memory_bytes: int | None
    log_path: Path
    # The job's (proven) owner: CUE_USER. Empty only for a context built without a job.
    user: str = ""
    # The job's show and shot (CUE_SHOW, CUE_SHOT); empty when the job has none.
    show: str = ""
    shot: str = ""

    @property
    def chunk_frames(self) -> tuple[int, ...]:
        # A context built without ``frames`` still describes a one-frame chunk.
        return self.frames or (self.frame_number,)

    @property
    def name(self) -> str:
        return frame_name(self.frame_number, self.layer)


def frame_name(number: int, layer: str) -> str:
    """OpenCue's frame name, ``<number zero-padded to 4>-<layer>`` (``0001-render``)."""
    return f"{_zpad(number)}-{layer}"


def _zpad(number: int) -> str:
    # f"{n:04d}": 7 -> "0007", 12345 -> "12345", and -1 -> "-001" (the sign counts in the width,
    # as in Python/C printf; OpenCue's Java String.format("%04d") gives the same).
    return f"{number:04d}"


def frame_env(
    ctx: FrameContext,
    *,
    layer_env: Mapping[str, str],
    isolation: Mapping[str, str],
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The frame's environment. Precedence, lowest first:

    1. ``base`` — the worker's environment (``config.inherited_environ()`` by default) with
       every inherited ``CUE_*`` variable removed, so a worker started from inside another
       frame does not leak that frame's identity or devices, and without the worker's own
       store credentials (``PGPASSWORD``, ``PGPASSFILE``): a job must not be able to read
       the farm database's password (a layer may still set them explicitly);
    2. ``layer_env`` — the layer's ``env``;
    3. the ``CUE_*`` frame variables below;
    4. ``isolation`` — the device variables from the lease (``CUDA_VISIBLE_DEVICES``,
       ``CUE_GPUS``, …). Last, so neither the layer env nor the inherited env can un-hide a
       device.

    Frame variables (all strings; OpenCue's set, compared in docs/opencue.md):

    ========================  ===============================================================
    ``CUE3``                  ``1``: running under the cue (as OpenCue)
    ``CUE_USER``              the job's owner (the proven submitter)
    ``CUE_SHOW``, ``CUE_SHOT``  the job's show and shot (empty when it has none)
    ``CUE_JOB`` …             job/layer names and ids, ``CUE_FRAME_ID`` the frame's id
    ``CUE_IFRAME``            frame number (first of the chunk)
    ``CUE_FRAME``             frame name ``0001-layer``
    ``CUE_RANGE``             the layer's frame range; ``CUE_CHUNK`` the chunk size
    ``CUE_ATTEMPT``           attempt number, 1-based
    ``CUE_THREADS``           reserved cores, rounded down, at least 1
    ``CUE_MEMORY``            reserved host memory in **bytes** (OpenCue gives KB; cuectl uses
                              bytes everywhere, DESIGN §6/§9)
    ``CUE_GPU_MEMORY``        per-device GPU memory granted, bytes; ``0`` when no GPU was
                              granted (or its size is unknown)
    ``CUE_LOG_PATH``          the frame's log file (OpenCue gives the job's log directory)
    ========================  ===============================================================
    """
    return env_template(ctx, layer_env=layer_env, isolation=isolation, base=base).env(ctx)


class EnvTemplate:
    """A frame's environment less the frame's own values (``CUE_FRAME_ID``, ``CUE_IFRAME``,
    ``CUE_FRAME``, ``CUE_ATTEMPT``, ``CUE_LOG_PATH``): the same for every frame of a layer
    on the same devices, so a worker makes it once per layer rather than once per frame
    (validating the layer's environment, formatting a dozen values). :meth:`env` puts the
    frame's values in, in :func:`frame_env`'s order of precedence."""

    __slots__ = ("head", "tail")

    def __init__(self, head: dict[str, str], tail: dict[str, str]) -> None:
        self.head = head  # inherited < layer env < the CUE_* variables every frame of the layer shares
        self.tail = tail  # the isolation variables, last

    def env(self, ctx: FrameContext) -> dict[str, str]:
        env = self.head.copy()
        env["CUE_FRAME_ID"] = str(ctx.frame_id)
        env["CUE_IFRAME"] = str(ctx.frame_number)
        env["CUE_FRAME"] = ctx.name
        env["CUE_ATTEMPT"] = str(ctx.attempt)
        env["CUE_LOG_PATH"] = str(ctx.log_path)
        env.update(self.tail)
        return env


def env_template(
    ctx: FrameContext,
    *,
    layer_env: Mapping[str, str],
    isolation: Mapping[str, str],
    base: Mapping[str, str] | None = None,
) -> EnvTemplate:
    """:func:`frame_env` less the frame's own values, from the values of ``ctx`` that every
    frame of its layer shares; raises as :func:`frame_env` does."""
    inherited = config.inherited_environ() if base is None else base
    head = dict(inherited) if isinstance(inherited, FrameBase) else frame_base(inherited)
    head.update(_checked_env(layer_env, "layer env"))
    head.update(_layer_vars(ctx))
    return EnvTemplate(head, _checked_env(isolation, "isolation env"))


# The worker's credentials for the store: never handed to the frames it runs.
_WORKER_SECRETS = frozenset({"PGPASSWORD", "PGPASSFILE"})


class FrameBase(dict[str, str]):
    """An environment already stripped as :func:`frame_env` strips its ``base``."""


def frame_base(inherited: Mapping[str, str]) -> FrameBase:
    """``inherited`` less inherited ``CUE_*`` variables and the worker's store credentials
    (see :func:`frame_env`); a worker makes it once, not once a frame."""
    return FrameBase((k, v) for k, v in inherited.items() if not k.startswith("CUE_") and k not in _WORKER_SECRETS)


def _layer_vars(ctx: FrameContext) -> dict[str, str]:
    # Cuebot's prepareRqdRunFrame set, less CUE_THREADABLE (no threadable flag); units differ
    # where noted in frame_env. These are the ones every frame of a layer shares;
    # EnvTemplate.env adds the frame's own (CUE_FRAME_ID, CUE_IFRAME, CUE_FRAME,
    # CUE_ATTEMPT, CUE_LOG_PATH).
    return {
        "CUE3": "1",
        "CUE_USER": ctx.user,
        "CUE_SHOW": ctx.show,
        "CUE_SHOT": ctx.shot,
        "CUE_JOB": ctx.job,
        "CUE_JOB_ID": str(ctx.job_id),
        "CUE_LAYER": ctx.layer,
        "CUE_LAYER_ID": str(ctx.layer_id),
        "CUE_RANGE": ctx.layer_range,
        "CUE_CHUNK": str(ctx.chunk),
        "CUE_THREADS": str(max(1, math.floor(ctx.cores))),
        "CUE_MEMORY": str(int(ctx.memory_bytes)),
        "CUE_GPU_MEMORY": str(int(ctx.gpu_memory_bytes or 0)),
    }


def _checked_env(values: Mapping[str, str], what: str) -> dict[str, str]:
    """Reject what ``execve`` cannot carry, with a message instead of a ValueError later."""
    out: dict[str, str] = {}
    for key, value in values.items():
        if not isinstance(key, str) or not key or "=" in key or "\0" in key:
            raise InvalidInput(f"{what}: invalid variable name {key!r}")
        if not isinstance(value, str) or "\0" in value:
            raise InvalidInput(f"{what}: {key} must be a string without NUL bytes")
        out[key] = value
    return out
