"""``cuectl serve``: the REST API (``/api/v1``), Prometheus metrics and health checks.

One ASGI app (FastAPI on uvicorn) over the same library the CLI uses: every read is a
``Store`` call or a ``cuectl.sched``/``cuectl.top`` view, every change goes through the store
*acting as* the user a bearer token (or, on a local Unix socket, the peer's uid) proves
(``Store.acting_as``). Nothing here is imported by the plain CLI: ``cuectl --version`` and
``cuectl job list`` never load the web framework.

Modules: ``problems`` (errors as application/problem+json), ``auth`` (who is calling),
``app`` (the routes), ``schemas`` and ``openapi`` (the OpenAPI document), ``storecalls``
(the store protocol a shared SQLite store's users speak through ``--socket``), ``web`` (the
monitor's pages and assets), ``metrics`` (the /metrics exposition), ``server`` (uvicorn:
TCP with optional TLS, or a Unix socket with SO_PEERCRED).
"""
