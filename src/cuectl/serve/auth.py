"""Who is calling: a bearer token from ``cuectl admin token create`` (looked up by its
hash in the store on every request, so a revoked token stops working at once), or on a
local Unix socket the peer's uid as the kernel reports it (``SO_PEERCRED``), or, only when
the server was started with ``--allow-anonymous-read``, an anonymous viewer.

Roles: ``viewer`` reads; ``user`` also submits and changes its own jobs; ``admin`` changes
anyone's. The store enforces ownership again (``Store.acting_as``), so a bug here cannot
let a user change another's job.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from typing import Any, Mapping

from cuectl.sched.store.base import Actor, Store
from cuectl.serve.problems import Problem

VIEWER, USER, ADMIN = "viewer", "user", "admin"
_RANK = {VIEWER: 0, USER: 1, ADMIN: 2}
PEER_UID_KEY = "cuectl.peer_uid"  # set in the ASGI scope by the Unix-socket protocol (server.py)


@dataclass(frozen=True)
class Principal:
    user: str
    role: str
    via: str  # token | peer | anonymous
    token_id: int | None = None
    uid: int | None = None  # the socket peer's uid (via peer): the store's owner may call what workers do

    def can(self, role: str) -> bool:
        return _RANK[self.role] >= _RANK[role]

    def actor(self) -> Actor:
        return Actor(self.user, self.role == ADMIN)

    def to_json(self) -> dict[str, Any]:
        return {
            "user": self.user,
            "role": self.role,
            "via": self.via,
            "token_id": self.token_id,
            "read_only": not self.can(USER),
        }


def _bearer(headers: Mapping[str, str]) -> str | None:
    value = headers.get("authorization")
    if value is None:
        return None
    scheme, _, secret = value.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise Problem(
            401,
            "the Authorization header must be 'Bearer <token>'",
            headers={"WWW-Authenticate": 'Bearer realm="cuectl"'},
        )
    return secret.strip()


def peer_principal(uid: int, store: Store) -> Principal:
    """The local user with this uid, as the CLI would see them on this store."""
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    # The same rule as the CLI on this store: root, or the owner of a SQLite store's file.
    owner = -2
    if store.local_path is not None:
        try:
            owner = os.stat(store.local_path).st_uid
        except OSError:
            pass
    return Principal(name, ADMIN if uid in (0, owner) else USER, "peer", uid=uid)


def identify(
    headers: Mapping[str, str], scope: Mapping[str, Any], store: Store, *, now: float, anonymous_read: bool
) -> Principal:
    """The caller, or ``Problem(401)``."""
    secret = _bearer(headers)
    if secret is not None:
        token = store.authenticate(secret, now=now) if len(secret) <= 200 else None
        if token is None:
            raise Problem(
                401,
                "the token is not valid (unknown or revoked)",
                hint="ask an admin for one: cuectl admin token create USER",
                headers={"WWW-Authenticate": 'Bearer realm="cuectl", error="invalid_token"'},
            )
        return Principal(token.user, token.role, "token", token.id)
    uid = scope.get(PEER_UID_KEY)
    if isinstance(uid, int):
        return peer_principal(uid, store)
    if anonymous_read:
        return Principal("anonymous", VIEWER, "anonymous")
    raise Problem(
        401,
        "authentication required: send 'Authorization: Bearer <token>'",
        hint="ask an admin for a token: cuectl admin token create USER",
        headers={"WWW-Authenticate": 'Bearer realm="cuectl"'},
    )


def require(principal: Principal, role: str, what: str) -> None:
    if not principal.can(role):
        raise Problem(
            403, f"{what}: the {principal.role} role of {principal.user} may not do this (needs {role} or admin)"
        )
