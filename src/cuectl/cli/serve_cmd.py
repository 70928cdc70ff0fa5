"""``cuectl serve``: the REST API, /metrics and health checks (``cuectl.serve``).

The web framework is imported only here, inside the command: the rest of the CLI never
loads it."""


from typing import Optional

import typer


def serve_cmd(
    ctx: typer.Context,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (0.0.0.0: every interface; "
                                                          "use TLS or a reverse proxy then)."),
    port: int = typer.Option(8448, "--port", help="TCP port."),
    socket_path: Optional[str] = typer.Option(None, "--socket", help="Serve on this Unix socket instead of TCP; "
                                                                   "callers without a token are the peer's "
                                                                   "uid (SO_PEERCRED)."),
    certfile: Optional[str] = typer.Option(None, "--certfile", help="TLS certificate (PEM), with --keyfile."),
    keyfile: Optional[str] = typer.Option(None, "--keyfile", help="TLS private key (PEM)."),
    allow_anonymous_read: bool = typer.Option(False, "--allow-anonymous-read",
                                              help="Let callers without a token read (never change) everything."),
    cache: float = typer.Option(1.0, "--cache", help="Seconds a hot read (job/host/frame lists) is shared "
                                                    "between clients (0: off)."),
    access_log: bool = typer.Option(True, "--access-log/--no-access-log", help="Log each request."),
) -> None:
    """Serve the REST API (/api/v1), /metrics, /healthz and /readyz (docs/api.md)."""
    from cuectl import config
    from cuectl.errors import InvalidInput

    if not 0 < port < 65536:
        raise InvalidInput(f"--port: {port} is not a TCP port (1-65535)")
    if cache < 0:
        raise InvalidInput(f"--cache: must be 0 or more, got {cache:g}")
    store = ctx.obj.store()  # fail now, with one error line, if the store is missing or unusable
    if store.pooled:
        # Each request acts as its caller with SET ROLE, a session setting a transaction
        # pooler would leave on a server connection that others then use.
        raise InvalidInput("cuectl serve cannot use a store URL with pgbouncer=true: it acts as each caller "
                           "with SET ROLE, which a transaction pooler would hand to other clients",
                           hint="give serve a URL straight to PostgreSQL (docs/postgres.md)")
    from cuectl.serve.app import Settings, create_app
    from cuectl.serve.server import check_tls, serve

    check_tls(certfile, keyfile)
    settings = Settings(db_url=ctx.obj.db or config.default_db_url(), busy_timeout_s=config.busy_timeout(),
                        anonymous_read=allow_anonymous_read, cache_s=cache, lock_dir=config.lock_dir(),
                        frame_limit=config.frame_limit())
    ctx.obj.close()
    serve(create_app(settings), host=host, port=port, uds=socket_path, certfile=certfile, keyfile=keyfile,
          access_log=access_log)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_cmd)
