"""Who submitted a job, proven by the kernel or the database server, never by a label.

A job row's ``user`` is a label any client that can write the store could set. A root
worker switches to that user only on proof (docs/security.md has the threat model):

- **PostgreSQL**: ``jobs.submitted_by`` is set by the server to the role that inserted the
  row (a trigger overrides any value the client sends; another forbids changing it). A job
  is proven to be U's when that role is named U.
- **SQLite**: at submit the client writes a *receipt* into the store's spool directory
  (``receipts/`` beside the store, sticky, like /tmp): a file the kernel marks as owned by
  the submitting uid, holding a digest of each layer's command, environment and frames —
  and (receipts of version 2) of every value a command token expands into, so the job's
  name, show and shot too. The job row names the receipt. A job is proven to be U's when
  its receipt is a regular file with one link, owned by U's uid, read without following
  links, and its digests match the layer the worker is about to run — so neither
  relabelling a job nor editing another user's command, or the name its ``#JOB#`` token
  puts into the command, in the shared file gets anything run as someone else.
  A version-1 receipt (cuectl before receipts were versioned) does not cover the job's
  name: it still proves a layer whose command uses no ``#JOB#`` token, never one that does.

Without proof, a root worker does not run the job, and its pending reason says why.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pwd
import secrets
import stat
from pathlib import Path
from typing import Any, Mapping, Sequence

from cuectl.errors import Unproven

SPOOL = "receipts"
_MAX_RECEIPT_BYTES = 1 << 20
# The receipt body's "v": 2 adds the job's name, show and shot to each layer's digest. A
# receipt without "v" is version 1 (written before versions: its digests lack them).
RECEIPT_VERSION = 2
# Command tokens (run/frame/tokens.py, ``_TOKEN_RE``) whose value comes from a store field a
# version-1 digest does not cover: ``#JOB#`` (the job's name). The others expand from the
# layer's name, its range and chunk (the digest's own fields) and the claimed frame's
# numbers (integers, never text).
_V1_UNCOVERED_TOKENS = ("#JOB#",)


def layer_digest(
    *,
    job_id: int,
    user: str,
    layer: str,
    command: Sequence[str] | str,
    env: Mapping[str, str],
    frame_range: str,
    chunk: int,
    cwd: str | None = None,
    version: int = RECEIPT_VERSION,
    job_name: str | None = None,
    show: str | None = None,
    shot: str | None = None,
) -> str:
    """What a receipt vouches for, per layer: everything that decides what runs as the user
    — the directory too: `python train.py` run in someone else's directory runs their code
    — and (``version`` 2) every value a command token expands into that is not one of those
    already: the job's name (``#JOB#``), with its show and shot (``CUE_SHOW``/``CUE_SHOT``).
    ``version`` 1 is the digest of receipts written before versions, checked as it was.
    (Without a directory the digest is what it was before directories were recorded, so
    receipts of older jobs still match.)"""
    body: dict[str, Any] = {
        "job": int(job_id),
        "user": user,
        "layer": layer,
        "command": command if isinstance(command, str) else list(command),
        "env": dict(sorted(env.items())),
        "range": frame_range,
        "chunk": int(chunk),
    }
    if cwd is not None:
        body["cwd"] = cwd
    if version >= 2:
        if job_name is None:
            raise ValueError("a version-2 layer digest needs the job's name")
        body.update(v=int(version), job_name=job_name, show=show, shot=shot)
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _uses_v1_uncovered_token(command: Sequence[str] | str) -> str | None:
    """The first token of ``command`` whose value a version-1 receipt does not prove."""
    parts = [command] if isinstance(command, str) else command
    for token in _V1_UNCOVERED_TOKENS:
        if any(isinstance(part, str) and token in part for part in parts):
            return token
    return None


def ensure_spool(store_dir: Path) -> Path:
    """The spool directory beside a SQLite store: the store directory's permissions plus the
    sticky bit, so members who may submit can add receipts but not remove others'."""
    spool = store_dir / SPOOL
    try:
        os.mkdir(spool)
    except FileExistsError:
        return spool
    mode = stat.S_IMODE(os.stat(store_dir).st_mode)
    os.chmod(spool, (mode & 0o2777) | stat.S_ISVTX)
    return spool


def write_receipt(
    spool: Path,
    *,
    job_id: int,
    user: str,
    digests: Mapping[str, str],
    owner: str | None = None,
    notify_commands: Sequence[str] = (),
) -> str:
    """Create the receipt (owned by this process's uid, by the kernel); return its name. The
    name is unguessable, so nobody can take it before the submitter does.

    ``owner``: a root API server submitting for a token's user gives the receipt to that
    user's uid (root may; nobody else can), so it proves exactly what the user's own
    submit would. Not root, or no such user here: the receipt stays the server's, and a
    root worker refuses the job as not proven (docs/api.md)."""
    name = f"{job_id}-{secrets.token_hex(8)}.json"
    fd = os.open(spool / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444)
    try:
        if owner is not None and os.geteuid() == 0:
            try:
                os.fchown(fd, pwd.getpwnam(owner).pw_uid, -1)
            except KeyError:
                pass
        # ``digests``: made by ``layer_digest`` of this version (the default).
        body: dict[str, Any] = {"v": RECEIPT_VERSION, "job": job_id, "user": user, "layers": dict(digests)}
        if notify_commands:  # the job's notification command hooks run as the user too
            body["notify_commands"] = sorted(set(notify_commands))
        os.write(fd, json.dumps(body).encode())
    finally:
        os.close(fd)
    return name


def _uid_of(user: str) -> int:
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        raise Unproven(f"user {user!r} does not exist on this host") from None


def _vouches(uid: int, spool: Path) -> bool:
    """Whether a receipt owned by ``uid`` speaks for whichever user it names: only the
    service account that the administrator named (``CUECTL_SERVICE_USER``: it runs
    ``cuectl serve --socket`` for everyone, and only it writes the store), and only in a
    spool that account alone can write. Root's own API server gives receipts to their users
    instead; nobody else ever vouches for another user."""
    from cuectl import config

    name = config.service_user()
    if not name or uid == 0:
        return False
    try:
        if pwd.getpwnam(name).pw_uid != uid:
            return False
        st = os.lstat(spool)
    except (KeyError, OSError):
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o022


def read_receipt(spool: Path | None, name: str | None, *, user: str, job_id: int) -> dict[str, Any]:
    """The receipt's content if it proves that ``user`` submitted job ``job_id``."""
    if spool is None or not name:
        raise Unproven("the job has no receipt (submitted by an older cuectl, or written into the store directly)")
    if "/" in name or name in (".", ".."):
        raise Unproven(f"the job's receipt name {name!r} is not a file in the spool")
    try:
        fd = os.open(spool / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        reason = "is a symbolic link" if exc.errno == errno.ELOOP else f"cannot be read ({exc.strerror})"
        raise Unproven(f"the job's receipt {name} {reason}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            raise Unproven(f"the job's receipt {name} is not a plain file with one link")
        expected = _uid_of(user)
        if info.st_uid != expected and not _vouches(info.st_uid, spool):
            raise Unproven(f"the job's receipt {name} belongs to uid {info.st_uid}, not to {user} (uid {expected})")
        data = json.loads(os.read(fd, _MAX_RECEIPT_BYTES))
    except ValueError:
        raise Unproven(f"the job's receipt {name} is not a cuectl receipt") from None
    finally:
        os.close(fd)
    if not isinstance(data, dict) or data.get("job") != job_id or data.get("user") != user:
        raise Unproven(f"the job's receipt {name} was written for another job or user")
    version = data.get("v", 1)
    if type(version) is not int or version < 1:
        raise Unproven(f"the job's receipt {name} is not a cuectl receipt (version {version!r})")
    if version > RECEIPT_VERSION:
        raise Unproven(
            f"the job's receipt {name} is of version {version}, newer than this cuectl reads "
            f"({RECEIPT_VERSION}): upgrade the worker"
        )
    return data


def job_proof_problem(job: Mapping[str, Any], spool: Path | None) -> str | None:
    """``proof_problem`` of a job as ``Store.get_job`` returns it (``spool``: the store's
    ``receipt_dir``): why nothing proves that its user submitted it, for pending reasons."""
    return proof_problem(
        user=job["user"],
        job_id=job["id"],
        submitted_by=job.get("submitted_by"),
        receipt=job.get("receipt"),
        spool=spool,
    )


def proof_problem(
    *, user: str, job_id: int, submitted_by: str | None, receipt: str | None, spool: Path | None
) -> str | None:
    """Why the store cannot prove that ``user`` submitted the job (None: it can)."""
    # A database server's word (PostgreSQL, where there is no spool). In a SQLite file the
    # column is only what someone wrote there: never proof.
    if submitted_by is not None and spool is None:
        if submitted_by == user:
            return None
        return f"it was submitted by the database role {submitted_by!r}, not {user!r}"
    try:
        read_receipt(spool, receipt, user=user, job_id=job_id)
    except Unproven as exc:
        return exc.message
    return None


def check_layer(
    *,
    user: str,
    job_id: int,
    layer: str,
    command: Sequence[str] | str,
    env: Mapping[str, str],
    frame_range: str,
    chunk: int,
    submitted_by: str | None,
    receipt: str | None,
    spool: Path | None,
    job_name: str,
    cwd: str | None = None,
    show: str | None = None,
    shot: str | None = None,
) -> None:
    """Raise ``Unproven`` unless the layer about to run as ``user`` is what ``user`` submitted:
    each value given is the one the proof covers (``job_name``, ``show``, ``shot`` too, on a
    version-2 receipt), so the caller may use them as they are. A version-1 receipt proves
    a layer only if its command uses no token whose value it does not cover (``#JOB#``)."""
    if submitted_by is not None and spool is None:
        problem = proof_problem(user=user, job_id=job_id, submitted_by=submitted_by, receipt=None, spool=None)
        if problem:
            raise Unproven(problem)
        return
    data = read_receipt(spool, receipt, user=user, job_id=job_id)
    version = data.get("v", 1)
    want = layer_digest(
        job_id=job_id,
        user=user,
        layer=layer,
        command=command,
        env=env,
        frame_range=frame_range,
        chunk=chunk,
        cwd=cwd,
        version=version,
        job_name=job_name,
        show=show,
        shot=shot,
    )
    if (data.get("layers") or {}).get(layer) != want:
        covered = (
            "environment, directory, frames, or the job's name, show or shot"
            if version >= 2
            else "environment, directory or frames"
        )
        raise Unproven(
            f"layer {layer!r} is not what {user} submitted (its command, {covered} were changed in "
            "the store after submission)"
        )
    if version < 2 and (token := _uses_v1_uncovered_token(command)) is not None:
        raise Unproven(
            f"layer {layer!r} was submitted by an older cuectl whose receipt does not cover the job's "
            f"name, and its command uses the {token} token, which expands to it: resubmit the job"
        )


def check_notify_command(
    *, user: str, job_id: int, command: str, submitted_by: str | None, receipt: str | None, spool: Path | None
) -> None:
    """Raise ``Unproven`` unless ``command`` is a notification hook ``user`` submitted with the
    job (PostgreSQL: the job is the role's, and only it or a worker/admin writes its rows;
    SQLite: the hook is in the user's receipt, so nobody else who can write the file can
    add a command that runs as the user)."""
    if submitted_by is not None and spool is None:
        problem = proof_problem(user=user, job_id=job_id, submitted_by=submitted_by, receipt=None, spool=None)
        if problem:
            raise Unproven(problem)
        return
    data = read_receipt(spool, receipt, user=user, job_id=job_id)
    if command not in (data.get("notify_commands") or []):
        raise Unproven(
            f"the notification command is not one {user} submitted with job {job_id} "
            "(a farm default, or written into the store after submission)"
        )
