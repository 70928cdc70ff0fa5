"""The web monitor's pages (issue 15): a single-page app served by ``cuectl serve`` at ``/``.

The pages are static files shipped in the package (``web/``: index.html and its ES modules,
stylesheet and icon); they read and change the farm only through the public REST API with
the caller's bearer token, so they can do nothing a ``curl`` with that token cannot.

Every answer carries headers that keep the pages honest: a strict Content-Security-Policy
(no inline script or style, nothing from another origin: job names, env values and logs are
hostile input, and the code only ever inserts them as text), ``nosniff``, no referrer, and
``Cache-Control: no-cache`` with a content-hash ``ETag`` so a browser revalidates each load
(a ``304`` costs nothing) and picks up a new version at once after an upgrade.
"""

from __future__ import annotations

import hashlib
import re
import stat
from pathlib import Path

from fastapi import FastAPI, Request
from starlette.responses import Response

from cuectl.serve.problems import response as problem

# Beside this module in the installed package (package data "serve/web/*"); cuectl is not
# installed zipped, so a plain path is enough.
WEB_DIR = Path(__file__).resolve().parent / "web"

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}


# name -> (mtime_ns, size, body, etag): the files are small and few; a changed file (an
# upgrade, or editing them in a checkout) is read again.
_cache: dict[str, tuple[int, int, bytes, str]] = {}


# The directory's names: letters, digits, ``-``, ``_`` and ``.``. Anything else (a NUL, which
# the filesystem calls would raise on, another control character, a separator, a space)
# names no file of it and is refused before the filesystem is asked.
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}", re.ASCII)


def _load(name: str) -> tuple[bytes, str] | None:
    if not _NAME.fullmatch(name):
        return None
    path = WEB_DIR / name
    if TYPES.get(path.suffix) is None:
        return None
    try:
        st = path.lstat()
    except (OSError, ValueError):  # ValueError: a name the OS cannot take (the check above keeps them out)
        return None
    if not stat.S_ISREG(st.st_mode):  # no links, directories or devices
        return None
    hit = _cache.get(name)
    if hit is not None and hit[:2] == (st.st_mtime_ns, st.st_size):
        return hit[2], hit[3]
    body = path.read_bytes()
    etag = '"' + hashlib.blake2b(body, digest_size=12).hexdigest() + '"'
    _cache[name] = (st.st_mtime_ns, st.st_size, body, etag)
    return body, etag


def _asset(request: Request, name: str) -> Response:
    """One file of ``WEB_DIR`` by its plain name (no paths: the name must be one of the
    directory's own regular files with a known type), revalidated by ``ETag``."""
    found = _load(name)
    if found is None:
        return problem(404, f"no page asset {name[:100]!r}")
    body, etag = found
    headers = {**HEADERS, "ETag": etag}
    if etag in (tag.strip().removeprefix("W/") for tag in request.headers.get("if-none-match", "").split(",")):
        return Response(status_code=304, headers=headers)
    return Response(body, media_type=TYPES[Path(name).suffix], headers=headers)


def mount(app: FastAPI) -> None:
    """Add the monitor's routes to ``app``: ``/`` (the page) and ``/static/<file>``. Kept
    out of the OpenAPI schema: they are not part of the API."""

    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def index(request: Request) -> Response:  # async: a cached file needs no worker thread
        return _asset(request, "index.html")

    @app.api_route("/static/{name}", methods=["GET", "HEAD"], include_in_schema=False)
    async def static(name: str, request: Request) -> Response:
        return _asset(request, name)
