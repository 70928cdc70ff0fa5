"""``cuectl serve``: the REST API, /metrics and health checks (``cuectl.serve``).

The web framework is imported only here, inside the command: the rest of the CLI never
loads it."""

from typing import Optional

import typer

OPENCUE_DEFAULT = "127.0.0.1:8443"  # Cuebot's port: where OpenCue's clients look first


def serve_cmd(
    ctx: typer.Context,
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to bind (0.0.0.0: every interface; use TLS or a reverse proxy then)."
    ),
    port: int = typer.Option(8448, "--port", help="TCP port."),
    socket_path: Optional[str] = typer.Option(
        None,
        "--socket",
        help="Serve on this Unix socket instead of TCP; callers without a token are the peer's uid (SO_PEERCRED).",
    ),
    certfile: Optional[str] = typer.Option(None, "--certfile", help="TLS certificate (PEM), with --keyfile."),
    keyfile: Optional[str] = typer.Option(None, "--keyfile", help="TLS private key (PEM)."),
    allow_anonymous_read: bool = typer.Option(
        False, "--allow-anonymous-read", help="Let callers without a token read (never change) everything."
    ),
    cache: float = typer.Option(
        1.0, "--cache", help="Seconds a hot read (job/host/frame lists) is shared between clients (0: off)."
    ),
    access_log: bool = typer.Option(True, "--access-log/--no-access-log", help="Log each request."),
    opencue: Optional[str] = typer.Option(
        None,
        "--opencue",
        envvar="CUECTL_OPENCUE",
        metavar="[HOST:PORT]",
        help="Serve OpenCue's gRPC protocol (Cuebot's) instead, for cueadmin, "
        f"cueman, pycue, CueSubmit and CueGUI; default {OPENCUE_DEFAULT} "
        "(docs/opencue-grpc.md).",
    ),
    trust_network: list[str] = typer.Option(
        [],
        "--opencue-trust-network",
        metavar="CIDR",
        help="With --opencue: callers from this network may change jobs as "
        "the user their request names, unproven (OpenCue's own trust "
        "model; never root). Repeatable. Default: other hosts only read.",
    ),
) -> None:
    """Serve the REST API (/api/v1), /metrics, /healthz and /readyz (docs/api.md), or with
    --opencue OpenCue's gRPC protocol (docs/opencue-grpc.md)."""
    from cuectl import config
    from cuectl.errors import InvalidInput
    from cuectl.run.libc import set_undumpable

    # A long-lived holder of the store's password and of every caller's token: no other
    # process of this user may read its memory (/proc/PID/mem, ptrace; issue 35).
    set_undumpable()
    if cache < 0:
        raise InvalidInput(f"--cache: must be 0 or more, got {cache:g}")
    if (ctx.obj.db or config.default_db_url()).startswith("unix:"):
        raise InvalidInput(
            "cuectl serve needs the store itself (a path or postgresql://...), not another server's socket",
            hint="run serve as the store's owner with --db PATH",
        )
    if opencue is not None:
        return _serve_opencue(ctx, opencue, trust_network, cache)
    if trust_network:
        raise InvalidInput("--opencue-trust-network goes with --opencue")
    if not 0 < port < 65536:
        raise InvalidInput(f"--port: {port} is not a TCP port (1-65535)")
    store = ctx.obj.store()  # fail now, with one error line, if the store is missing or unusable
    if store.pooled:
        # Each request acts as its caller with SET ROLE, a session setting a transaction
        # pooler would leave on a server connection that others then use.
        raise InvalidInput(
            "cuectl serve cannot use a store URL with pgbouncer=true: it acts as each caller "
            "with SET ROLE, which a transaction pooler would hand to other clients",
            hint="give serve a URL straight to PostgreSQL (docs/postgres.md)",
        )
    from cuectl.serve.app import Settings, create_app
    from cuectl.serve.server import check_tls, serve

    check_tls(certfile, keyfile)
    settings = Settings(
        db_url=ctx.obj.db or config.default_db_url(),
        busy_timeout_s=config.busy_timeout(),
        anonymous_read=allow_anonymous_read,
        cache_s=cache,
        lock_dir=config.lock_dir(),
        frame_limit=config.frame_limit(),
    )
    ctx.obj.close()
    serve(
        create_app(settings),
        host=host,
        port=port,
        uds=socket_path,
        certfile=certfile,
        keyfile=keyfile,
        access_log=access_log,
    )


def _serve_opencue(ctx: typer.Context, address: str, trust_network: list[str], cache: float) -> None:
    import logging

    from cuectl import config
    from cuectl.errors import InvalidInput

    try:
        from cuectl.cuebot import server
    except ImportError as exc:
        raise InvalidInput(
            f"--opencue needs the opencue extra ({exc.name} is missing)", hint="pip install 'cuectl[opencue]'"
        ) from None
    server.parse_address(address)  # one error line for a bad address, before anything else
    settings = server.Settings(
        db_url=ctx.obj.db or config.default_db_url(),
        busy_timeout_s=config.busy_timeout(),
        trusted_networks=server.parse_networks(trust_network),
        cache_s=cache,
    )
    store = ctx.obj.store()  # fail now, with one error line, if the store is missing or unusable
    if store.pooled:
        raise InvalidInput(
            "cuectl serve --opencue cannot use a store URL with pgbouncer=true: it acts as each caller with SET ROLE",
            hint="give it a URL straight to PostgreSQL (docs/postgres.md)",
        )
    ctx.obj.close()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    server.serve(settings, address)


def serve_args(args: list[str]) -> list[str]:
    """``--opencue`` with no address (the last word, or before another option) gets the
    default: click's options take a value or none, not an optional one."""
    out = list(args)
    for i, arg in enumerate(out):
        if arg == "--opencue" and (i + 1 == len(out) or out[i + 1].startswith("-")):
            out.insert(i + 1, OPENCUE_DEFAULT)
            break
    return out


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_cmd)
