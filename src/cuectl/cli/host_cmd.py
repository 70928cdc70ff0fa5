"""``cuectl host …``: registered hosts, their devices, locking."""

from typing import Any, Optional

import typer

from cuectl.cli import term
from cuectl.sched import model as m

host_app = typer.Typer(help="Inspect and lock worker hosts.", no_args_is_help=True)
JSON_OPT = typer.Option(False, "--json", help="Print JSON (stable keys, see docs/json.md).")


def _gpu_summary(gpus: list) -> str:
    if not gpus:
        return "-"
    counts: dict[str, int] = {}
    for d in gpus:
        counts[d["model"]] = counts.get(d["model"], 0) + 1
    return ", ".join(f"{n}x {model}" for model, n in counts.items())


@host_app.command("list")
def host_list(
    ctx: typer.Context,
    as_json: bool = JSON_OPT,
    vendor: Optional[str] = typer.Option(None, "--vendor", help="Only hosts with GPUs of this vendor."),
    model: Optional[str] = typer.Option(
        None, "--model", help="Only hosts with this GPU model (whole words or a glob, as gpu_models)."
    ),
    gpu_memory_min: Optional[str] = typer.Option(
        None, "--gpu-memory-min", help="Only hosts with GPUs of at least this memory (24G; a number is MiB)."
    ),
    gpu_capability_min: Optional[str] = typer.Option(
        None, "--gpu-capability-min", metavar="X.Y", help="Only GPUs of at least this CUDA compute capability."
    ),
    gpu_driver_min: Optional[str] = typer.Option(
        None, "--gpu-driver-min", metavar="VERSION", help="Only GPUs with at least this driver version."
    ),
    gpu_cuda_min: Optional[str] = typer.Option(
        None, "--gpu-cuda-min", metavar="X.Y", help="Only GPUs whose driver's CUDA version is at least this."
    ),
) -> None:
    """List registered hosts with UP/DOWN state and devices (with a GPU filter: only the
    hosts, and in --json only the devices, that match it)."""
    from cuectl.sched.fields import flag_label
    from cuectl.sched.hostfilter import device_matches, parse_memory_min, parse_vendor, parse_versions
    from cuectl.units import format_bytes

    vendor = parse_vendor(vendor, "--vendor")  # a misspelt vendor is an error, not an empty list
    memory_min = parse_memory_min(gpu_memory_min, "--gpu-memory-min")
    versions = parse_versions(
        {"gpu_capability_min": gpu_capability_min, "gpu_driver_min": gpu_driver_min, "gpu_cuda_min": gpu_cuda_min},
        flag_label,
    )
    store = ctx.obj.store()
    hosts = store.list_hosts(now=store.clock(), down_after=m.HOST_DOWN_AFTER_S)
    if vendor or model or memory_min or versions:
        hosts = [
            {
                **h,
                "gpus": [
                    g
                    for g in h["gpus"]
                    if device_matches(g, vendor=vendor, model=model, memory_min=memory_min, versions=versions)
                ],
            }
            for h in hosts
        ]
        hosts = [h for h in hosts if h["gpus"]]
    if as_json:
        term.emit_json({"hosts": hosts})
        return
    C = term.Col  # on a narrow terminal: LOCKED goes first, then CORES, MEMORY
    term.table(
        [
            C("NAME", fit="name"),
            C("STATE", "state"),
            C("LOCKED", drop=3),
            C("CORES", drop=2),
            C("MEMORY", drop=1),
            C("GPUS", fit="free"),
            C("LAST HEARTBEAT", "time"),
        ],
        [
            [
                h["name"],
                h["state"],
                "yes" if h["locked"] else "no",
                h["cores"],
                format_bytes(h["memory_bytes"]),
                _gpu_summary(h["gpus"]),
                h["last_heartbeat"],
            ]
            for h in hosts
        ],
    )


@host_app.command("show")
def host_show(ctx: typer.Context, host: str = typer.Argument(..., help="Host name."), as_json: bool = JSON_OPT) -> None:
    """Show a host, its devices (with live values from the last heartbeat) and running frames."""
    from cuectl.top import live_values
    from cuectl.units import format_bytes

    store = ctx.obj.store()
    data = store.get_host(host, now=store.clock(), down_after=m.HOST_DOWN_AFTER_S)
    if as_json:
        term.emit_json(data)
        return
    term.fields(
        [
            ("name", data["name"]),
            ("state", data["state"]),
            ("locked", data["locked"]),
            ("cores", data["cores"]),
            ("memory", format_bytes(data["memory_bytes"])),
            ("tags", ", ".join(data["tags"]) or "-"),
            ("last heartbeat", data["last_heartbeat"]),
            ("running frames", ", ".join(map(str, data["running_frames"])) or "-"),
        ]
    )
    live_doc = data.get("live") or {}
    # Each device's last sample as `top` judges it: none older than two of the worker's
    # sampling intervals is shown as current (SAMPLED says how old it is).
    live = live_values(live_doc, now=store.clock())
    term.line()
    if data["gpus"]:
        term.table(
            ["IDX", "UUID", "VENDOR", "MODEL", "MEMORY", "FREE", "UTIL", "SAMPLED"],
            [
                [
                    d["index"],
                    d["uuid"],
                    d["vendor"],
                    d["model"],
                    format_bytes(d.get("memory_total_bytes")),
                    format_bytes(live.get(d["uuid"], {}).get("memory_free_bytes")),
                    live.get(d["uuid"], {}).get("utilization_pct"),
                    _sampled(live.get(d["uuid"])),
                ]
                for d in data["gpus"]
            ],
        )
    else:
        term.line("no GPUs")
    # Devices the worker had and lost (its re-discovery no longer finds them): no new frames.
    unavailable = live_doc.get("unavailable") or []
    if unavailable:
        term.line("unavailable GPUs (no new frames go to them):")
    for gone in unavailable:
        why = f" ({gone['reason']})" if gone.get("reason") else ""
        term.line(f"  {gone.get('uuid')} ({gone.get('model')}): gone since {gone.get('since')}{why}")


def _sampled(value: dict[str, Any] | None) -> str:
    """``3s ago``, ``5m12s ago (stale)`` or ``-`` (never sampled)."""
    from cuectl.units import format_duration

    if not value or value.get("sample_age_s") is None:
        return "-"
    return f"{format_duration(value['sample_age_s'])} ago" + ("" if value["fresh"] else " (stale)")


@host_app.command("lock")
def host_lock(ctx: typer.Context, host: str, as_json: bool = JSON_OPT) -> None:
    """Stop dispatching new frames to a host (running frames finish)."""
    data = ctx.obj.store().set_host_locked(host, True)
    term.emit_json(data) if as_json else term.line(f"locked host {host}")


@host_app.command("unlock")
def host_unlock(ctx: typer.Context, host: str, as_json: bool = JSON_OPT) -> None:
    """Dispatch to a locked host again."""
    data = ctx.obj.store().set_host_locked(host, False)
    term.emit_json(data) if as_json else term.line(f"unlocked host {host}")


@host_app.command("forget")
def host_forget(
    ctx: typer.Context,
    host: str = typer.Argument(..., help="Host name."),
    force: bool = typer.Option(
        False,
        "--force",
        help="Forget it even while UP or with RUNNING frames (they are requeued as lost, as `admin reap` does).",
    ),
    as_json: bool = JSON_OPT,
) -> None:
    """Remove a dead host and its GPUs from the store (admins only).

    Refuses (exit 1) a host that is UP (heartbeat within the host-down time) or has
    RUNNING frames, unless --force. A worker that starts on it again registers it anew."""
    store = ctx.obj.store()
    data = store.forget_host(host, now=store.clock(), down_after=m.HOST_DOWN_AFTER_S, force=force)
    if as_json:
        term.emit_json(data)
        return
    requeued = data["requeued"]
    term.line(
        f"forgot host {host} ({data['state']}, {len(data['gpus'])} GPU(s))"
        + (f"; requeued {len(requeued)} frame(s): " + ", ".join(map(str, requeued)) if requeued else "")
    )


def register(app: typer.Typer) -> None:
    app.add_typer(host_app, name="host")
