"""``cuectl gpu ...``: the GPUs of this machine (no store needed).

Registered by the main CLI as ``gpu``. Errors are raised as ``cuectl.errors`` exceptions;
the main CLI turns them into ``error:`` lines and exit codes.
"""

from typing import Any, Optional

import typer

from cuectl.cli import term

app = typer.Typer(help="GPUs of this machine: what cuectl detects and how.", no_args_is_help=True)


@app.callback()
def _gpu() -> None:
    """GPUs of this machine: what cuectl detects and how."""
    # A callback keeps ``gpu`` a command group even while ``list`` is its only command.


def short_uuid(uuid: str) -> str:
    """Enough of a UUID to tell devices apart in a table: ``GPU-1937b558…``."""
    return uuid if len(uuid) <= 20 else uuid[:12] + "…"


def _pct(value: float | None) -> str | None:
    return None if value is None else f"{value:.0f}%"


def _states(ctx: typer.Context, host: str | None) -> tuple[str | None, dict[str, Any], str | None]:
    """This machine's host name, its devices' states from the store (uuid -> DeviceState) and
    why there are none (no store here: every device is ok as far as cuectl knows)."""
    from cuectl.errors import CuectlError

    try:
        from cuectl.run.service import worker_host

        name = worker_host(host)
        obj = getattr(ctx, "obj", None)
        if obj is None or not hasattr(obj, "store"):
            return name, {}, "no store"
        return name, {s.uuid: s for s in obj.store().device_states(name)}, None
    except CuectlError as exc:
        return host, {}, exc.message
    except ImportError as exc:  # a platform without the store's POSIX modules: no states here
        return host, {}, f"no store on this platform ({exc.name})"


@app.command("list")
def list_cmd(
    ctx: typer.Context,
    backend: str = typer.Option(
        "auto", "--backend", "-b", help="auto, nvml, smi, apple, amd or fake (fake reads CUECTL_FAKE_GPUS)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (devices and backends) on stdout."),
) -> None:
    """List this machine's GPUs, each with its state (ok, drained or lost: docs/gpu-health.md).
    No GPU is not an error: the list is empty and the backends say why."""
    from cuectl.gpu import discover
    from cuectl.units import format_bytes

    found = discover(backend)
    host, states, why = _states(ctx, None) if found.devices else (None, {}, None)

    def state_of(uuid: str) -> tuple[str, str | None]:
        s = states.get(uuid)
        return ("ok", None) if s is None or s.in_service else (s.state, s.reason)

    if as_json:
        doc = found.to_json()
        for d in doc["devices"]:
            d["state"], d["reason"] = state_of(d["uuid"])
        doc["host"] = host
        doc["states_unknown"] = why  # None: the states are the store's
        term.emit_json(doc)
        return
    rows = [
        (
            d.index,
            short_uuid(d.uuid),
            d.vendor,
            d.model,
            format_bytes(d.memory_total_bytes),
            format_bytes(d.memory_free_bytes),
            _pct(d.utilization_pct),
            d.driver_version,
            _state_text(*state_of(d.uuid)),
        )
        for d in found.devices
    ]
    if rows:
        term.table(["index", "uuid", "vendor", "model", "memory", "free", "util", "driver", "state"], rows)
        return
    term.info("no GPUs found")
    for status in found.backends:
        if not status.ok:
            term.info(f"  {status.name}: {status.error}" + (f" (hint: {status.hint})" if status.hint else ""))


def _state_text(state: str, reason: str | None) -> str:
    return state if reason is None else f"{state}: {reason}"


HOST_OPT = typer.Option(
    None, "--host", help="The host of the device (default: this machine, as its worker registers it)."
)


@app.command("drain")
def drain_cmd(
    ctx: typer.Context,
    device: str = typer.Argument(..., help="The device: its index on the host, or its UUID (or a unique prefix)."),
    host: Optional[str] = HOST_OPT,
    reason: str = typer.Option(..., "--reason", help="Why (one line, at most 200 characters): shown to everyone."),
    as_json: bool = typer.Option(False, "--json", help="Print the device's state as JSON."),
) -> None:
    """Take a GPU out of service on its host (admins or the host's owner): no new frame or
    lease gets it; a frame running on it finishes. `gpu undrain` brings it back."""
    from cuectl.run.service import worker_host

    store = ctx.obj.store()
    state = store.drain_device(worker_host(host), device, reason=reason, now=store.clock())
    if as_json:
        term.emit_json(state.to_json())
        return
    term.line(f"drained {state.uuid} on host {state.host}: {state.reason}")


@app.command("undrain")
def undrain_cmd(
    ctx: typer.Context,
    device: str = typer.Argument(..., help="The device: its index on the host, or its UUID (or a unique prefix)."),
    host: Optional[str] = HOST_OPT,
    as_json: bool = typer.Option(False, "--json", help="Print the device's state as JSON."),
) -> None:
    """Put a drained or lost GPU back in service (admins or the host's owner). A device the
    worker drained as sick (an Xid such as 79, uncorrectable ECC errors) comes back only so:
    reset it first (docs/gpu-health.md)."""
    from cuectl.run.service import worker_host

    store = ctx.obj.store()
    state = store.undrain_device(worker_host(host), device, now=store.clock())
    if as_json:
        term.emit_json(state.to_json())
        return
    term.line(f"undrained {state.uuid} on host {state.host}: back in service")


def doctor_lines() -> list[tuple[str, bool, str]]:
    """``(check name, ok, explanation)`` per GPU backend, for ``cuectl admin doctor``."""
    from cuectl.gpu.doctor import check_backends

    return [(f"gpu backend {c.name}", c.ok, c.line()) for c in check_backends()]
