"""``cuectl gpu ...``: the GPUs of this machine (no store needed).

Registered by the main CLI as ``gpu``. Errors are raised as ``cuectl.errors`` exceptions;
the main CLI turns them into ``error:`` lines and exit codes.
"""

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


@app.command("list")
def list_cmd(
    backend: str = typer.Option(
        "auto", "--backend", "-b", help="auto, nvml, smi, apple, amd or fake (fake reads CUECTL_FAKE_GPUS)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (devices and backends) on stdout."),
) -> None:
    """List this machine's GPUs. No GPU is not an error: the list is empty and the backends say why."""
    from cuectl.gpu import discover
    from cuectl.units import format_bytes

    found = discover(backend)
    if as_json:
        term.emit_json(found.to_json())
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
        )
        for d in found.devices
    ]
    if rows:
        term.table(["index", "uuid", "vendor", "model", "memory", "free", "util", "driver"], rows)
        return
    term.info("no GPUs found")
    for status in found.backends:
        if not status.ok:
            term.info(f"  {status.name}: {status.error}" + (f" (hint: {status.hint})" if status.hint else ""))


def doctor_lines() -> list[tuple[str, bool, str]]:
    """``(check name, ok, explanation)`` per GPU backend, for ``cuectl admin doctor``."""
    from cuectl.gpu.doctor import check_backends

    return [(f"gpu backend {c.name}", c.ok, c.line()) for c in check_backends()]
