"""One gRPC call: who makes it (proven by the kernel, claimed on a trusted network, or an
anonymous reader), the store it reads, and the one way a change is made (``Call.acting``).

OpenCue's clients send no credentials: a user name, where a request carries one, is
whatever the client wrote. So a name in a request is never believed on its own: on
loopback the caller is the uid owning the client's socket (cuebot/peer.py); from a network
an admin listed with ``--opencue-trust-network`` the request's name is taken at its word,
as Cuebot does, but never for root; from anywhere else a caller only reads.
"""

from __future__ import annotations

import contextlib
import pwd
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import grpc

from cuectl.errors import NotOwner
from cuectl.sched.store.base import Actor, Store
from cuectl.serve.auth import Principal

PROVEN, CLAIMED, REMOTE = "kernel", "claimed", "remote"


class Refused(Exception):
    """Ends the call with a gRPC status (``code``) and ``message``."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Call:
    store: Store
    who: Principal  # via: kernel | claimed | remote
    now: float
    log_dir_of: Any = None  # job id -> its OpenCue log dir (server.py)

    @contextlib.contextmanager
    def acting(self, owner: str | None = None, claimed: str | None = None) -> Iterator[Store]:
        """Make a change as the caller: the store checks ownership again. ``owner``: the
        changed job's user; ``claimed``: the user name the request carries, if any."""
        if self.who.via == REMOTE:
            raise Refused(
                grpc.StatusCode.PERMISSION_DENIED,
                "this server is read-only to callers from other hosts (OpenCue's clients prove no "
                "identity); connect on loopback, or ask an admin about --opencue-trust-network",
            )
        if self.who.via == CLAIMED:
            name = (claimed or owner or "").strip()
            if not name:
                raise Refused(grpc.StatusCode.PERMISSION_DENIED, "the request names no user to act as")
            if _is_root(name):
                raise Refused(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"a claimed user name is never taken for root ({name!r}): connect on loopback",
                )
            actor = Actor(name, False)
        else:
            actor = self.who.actor()
        with self.store.acting_as(actor):
            yield self.store

    @property
    def user(self) -> str:
        return self.who.user


def owner_only(store: Store, job: Mapping[str, Any]) -> None:
    """``NotOwner`` unless the store's actor owns ``job`` or is an admin: the store's own rule
    (the proven submitter where the server records one, else the job's user), for a request
    that turns out to change nothing, so that its answer never depends on the job's state
    (a kill of a job with no running frame, a retry of a layer with no dead one)."""
    actor = store.actor()
    owner = job.get("submitted_by") or job["user"]
    if not actor.admin and owner != actor.name:
        raise NotOwner(
            f"job {job['id']} ({job['name']}) belongs to {owner}, not {actor.name}: only its owner "
            "or an admin may change it"
        )


def _is_root(name: str) -> bool:
    try:
        return pwd.getpwnam(name).pw_uid == 0
    except KeyError:
        return name == "root"
