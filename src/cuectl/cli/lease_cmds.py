"""``cuectl run`` and ``cuectl gpu leases``: the command layer over ``cuectl.run.lease``.

Registered by ``cuectl.cli.main``::

    app.command("run", context_settings=RUN_CONTEXT_SETTINGS)(run_cmd)
    gpu_app.command("leases")(leases_cmd)

``RUN_CONTEXT_SETTINGS`` stops option parsing at the first word of the command, so both
``cuectl run --gpus 2 -- python train.py --lr 3e-4`` and ``cuectl run python train.py``
pass the command's own options through untouched.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer

from cuectl.cli import term
from cuectl.config import LOCK_DIR_DEFAULT

if TYPE_CHECKING:  # the lease machinery is imported only by the commands that use it
    from cuectl.run.lease import LeaseInfo

RUN_CONTEXT_SETTINGS = {"allow_interspersed_args": False}

_LOCK_DIR_OPT = typer.Option(
    None, "--lock-dir", metavar="DIR", help=f"Lease lock directory (default: {LOCK_DIR_DEFAULT})."
)


def run_cmd(
    command: Optional[List[str]] = typer.Argument(
        None, metavar="COMMAND", help="The command and its arguments (after `--`)."
    ),
    # No typer range checks here: the limits and their messages are those of `cuectl submit`.
    gpus: Optional[int] = typer.Option(
        None, "--gpus", help="Devices to lease (default: the --device count, else 1; 0 hides all)."
    ),
    gpu_vendor: Optional[str] = typer.Option(
        None, "--gpu-vendor", metavar="VENDOR", help="NVIDIA, AMD, Apple or Intel."
    ),
    gpu_model: Optional[List[str]] = typer.Option(
        None, "--gpu-model", metavar="MODEL", help="Allowed model (repeatable; any of), e.g. A100 or 'RTX 4090'."
    ),
    gpu_memory_min: Optional[str] = typer.Option(
        None, "--gpu-memory-min", metavar="SIZE", help="Memory per device, e.g. 24G (a bare number is MiB)."
    ),
    gpu_memory_free_min: Optional[str] = typer.Option(
        None,
        "--gpu-memory-free-min",
        "--min-free-memory",
        metavar="SIZE",
        help="Free memory per device right now, e.g. 8G.",
    ),
    gpu_capability_min: Optional[str] = typer.Option(
        None, "--gpu-capability-min", metavar="X.Y", help="CUDA compute capability per device, at least (8.9)."
    ),
    gpu_driver_min: Optional[str] = typer.Option(
        None, "--gpu-driver-min", metavar="VERSION", help="Driver version per device, at least (535.104.05)."
    ),
    gpu_cuda_min: Optional[str] = typer.Option(
        None, "--gpu-cuda-min", metavar="X.Y", help="The driver's CUDA version, at least (12.2)."
    ),
    device: Optional[List[str]] = typer.Option(
        None, "--device", metavar="ID", help="Choose among these devices only: index or UUID (repeatable)."
    ),
    gpu_share: Optional[str] = typer.Option(
        None,
        "--gpu-share",
        metavar="SIZE",
        help="Part of one GPU by memory budget (e.g. 8G), beside other shares, instead of a whole device.",
    ),
    wait: bool = typer.Option(
        True, "--wait/--no-wait", help="Wait for a free device (first come, first served) or fail at once."
    ),
    timeout: Optional[str] = typer.Option(
        None, "--timeout", metavar="DURATION", help="Give up waiting after this long (e.g. 90, 15m)."
    ),
    label: Optional[str] = typer.Option(None, "--label", help="Shown by `cuectl gpu leases` (default: the command)."),
    lock_dir: Optional[Path] = _LOCK_DIR_OPT,
) -> None:
    """Run COMMAND with an exclusive lease on local GPUs, beside queued frames.

    Exits with the command's status (128+N if signal N ended it); 1 if no device is free with --no-wait, naming who holds them.
    """
    from cuectl.run.adhoc import run_command

    # The console script answers an ordinary `cuectl run` without typer (cuectl.cli.entry),
    # through the same run_command: keep both paths on it.
    code = run_command(
        command or [],
        gpus=gpus,
        gpu_vendor=gpu_vendor,
        gpu_models=gpu_model or (),
        gpu_memory_min=gpu_memory_min,
        gpu_memory_free_min=gpu_memory_free_min,
        gpu_capability_min=gpu_capability_min,
        gpu_driver_min=gpu_driver_min,
        gpu_cuda_min=gpu_cuda_min,
        devices=device or None,
        gpu_share=gpu_share,
        wait=wait,
        timeout=timeout,
        label=label,
        lock_dir=lock_dir,
        say=term.info,
    )
    raise typer.Exit(code)


def leases_cmd(
    as_json: bool = typer.Option(False, "--json", help="Print JSON (stable keys, see docs/leases.md)."),
    lock_dir: Optional[Path] = _LOCK_DIR_OPT,
) -> None:
    """Every device of this host and who holds it: a worker's frame, `cuectl run`, or the Python API — any user."""
    from cuectl import config
    from cuectl.gpu import discover
    from cuectl.run.lease import list_leases
    from cuectl.run.lease.shares import share_infos

    directory = lock_dir or config.lock_dir()
    devices = discover().devices
    leases = list_leases(directory)
    by_uuid = {info.uuid: info for info in leases}
    # Shares of a device (docs/gpu-health.md): one lease object each, with its budget.
    shares = share_infos(Path(directory))
    shared: dict[str, list[dict[str, object]]] = {}
    for info, budget in shares:
        shared.setdefault(info.uuid, []).append({**info.to_json(), "share_bytes": budget})
    if as_json:
        term.emit_json(
            {
                "lock_dir": str(directory),
                "devices": [
                    {
                        "index": d.index,
                        "uuid": d.uuid,
                        "vendor": d.vendor,
                        "model": d.model,
                        "lease": by_uuid[d.uuid].to_json() if d.uuid in by_uuid else None,
                        "shares": shared.get(d.uuid, []),
                    }
                    for d in devices
                ],
                "leases": [{**info.to_json(), "share_bytes": None} for info in leases]
                + [s for d in shared.values() for s in d],
            }
        )
        return
    known = {d.uuid for d in devices}
    rows: list[list[object]] = []
    for d in devices:
        if d.uuid in shared:
            rows += [_row(d.index, d.model, d.uuid, info, budget) for info, budget in shares if info.uuid == d.uuid]
        else:
            rows.append(_row(d.index, d.model, d.uuid, by_uuid.get(d.uuid)))
    # Locks of devices this discovery does not list (another fake file, a MIG change).
    rows += [_row(i.index, "?", i.uuid, i) for i in leases if i.uuid not in known]
    rows += [_row(i.index, "?", i.uuid, i, budget) for i, budget in shares if i.uuid not in known]
    footer = None if devices or leases else f"no GPU found and no lease held in {directory}"
    C = term.Col  # on a narrow terminal the UUID goes first (the index and model name the device)
    term.table(
        [
            "GPU",
            C("MODEL", fit="name"),
            C("UUID", drop=1),
            C("HOLDER", fit="free"),
            "KIND",
            "PID",
            C("USER", fit="name"),
            C("SINCE", "time"),
        ],
        rows,
        footer=footer,
    )


def _row(index: int | None, model: str, uuid: str, info: LeaseInfo | None, share: int | None = None) -> list[object]:
    if info is None:
        return [index, model, uuid, "(free)", None, None, None, None]
    from cuectl.units import format_bytes, iso

    holder = info.holder if share is None else f"{info.holder} (share {format_bytes(share)})"
    return [index, model, uuid, holder, info.kind, info.pid, info.user, iso(info.since)]
