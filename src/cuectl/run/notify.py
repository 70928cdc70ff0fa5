"""Delivering recorded notifications (docs/notifications.md): webhooks, command hooks, email.

The store records one row per event and target in the transaction that made the event
happen (``sched/store/notifications.py``); a ``Deliverer`` claims due rows, delivers each
in the background (a thread per webhook, a subprocess per hook or email, each with a
timeout) and records the outcome from the caller's thread — the store is only ever used
from there. ``Deliverer.step`` never blocks: the worker calls it on every iteration.

- **webhook**: ``POST`` of the job's JSON (``job show --json``, plus ``notification``:
  id, event, frame_id) with ``Content-Type: application/json`` and the headers
  ``X-Cuectl-Event`` and ``X-Cuectl-Notification``; any 2xx answer is a delivery.
- **command**: ``/bin/sh -c COMMAND`` with the job's JSON on stdin and ``CUE_JOB_ID``,
  ``CUE_JOB``, ``CUE_EVENT``, ``CUE_FRAME_ID``, ``CUE_USER``, ``CUE_NOTIFICATION_ID`` set;
  exit 0 is a delivery. A root worker runs it as the job's proven user, never as root
  (``identity.check_notify_command``), as frames run.
- **email**: a short message piped to ``sendmail -t -i`` (``CUECTL_SENDMAIL``), as the
  job's proven user on a root deliverer, like a command hook.

A row's target is checked again here, whatever the store says (a row written straight into
it, a hand-edited file): a webhook is only ever an http(s) URL, opened with no handler for
any other scheme and never redirected to one; an email address holds no control character,
so it cannot add a header to what ``sendmail -t`` reads. Every delivery has a time limit,
and one that outlives it (a server that trickles its answer, a name lookup that hangs) is
recorded as failed and left behind, so a worker's drain always ends.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from cuectl import config
from cuectl.errors import CuectlError, InvalidInput, StoreError, Unproven
from cuectl.run import launch
from cuectl.sched import identity
from cuectl.sched import notify as nt
from cuectl.sched.store.base import Store

WEBHOOK_TIMEOUT_S = 10.0
COMMAND_TIMEOUT_S = 60.0
EMAIL_TIMEOUT_S = 30.0
# A claim outlives the longest delivery by a margin: a deliverer that dies holding one
# leaves the row to others after this (its own restarted worker releases it at once).
CLAIM_S = COMMAND_TIMEOUT_S + 60.0
# What a delivery may take, by kind, before it is recorded as failed whether or not its
# thread has ended: a socket timeout bounds each read of a webhook's answer, not the answer
# (a server sending a byte every few seconds), nor a name lookup. The margin covers killing
# a command or sendmail that ran out of time.
_LIMIT_S = {"webhook": WEBHOOK_TIMEOUT_S, "command": COMMAND_TIMEOUT_S, "email": EMAIL_TIMEOUT_S}
_MARGIN_S = 10.0
# After its process group was killed, how long to wait for a hook's or sendmail's own
# process: what it left behind in a session of its own may hold its output open for good.
_REAP_S = 5.0
_SECRETS = frozenset({"PGPASSWORD", "PGPASSFILE"})


class _Permanent(Exception):
    """A delivery that can never succeed (an unproven hook): give up at once."""


@dataclass
class _Delivery:
    row: dict[str, Any]
    thread: threading.Thread
    result: list[str | None] = field(default_factory=list)  # [None] delivered, [error] failed
    permanent: bool = False
    deadline: float = float("inf")  # time.monotonic() after which it counts as failed

    def overdue(self, now: float) -> str | None:
        """The error of a delivery still running past its deadline (None: not overdue)."""
        if not self.thread.is_alive() or now < self.deadline:
            return None
        limit = _LIMIT_S.get(str(self.row.get("kind")), WEBHOOK_TIMEOUT_S)
        return f"no result within {limit:g} s (abandoned: it may still complete)"


def subject(row: dict[str, Any]) -> str:
    """``cuectl: job 12 render finished`` / ``… failed`` / ``… frame 34 DEAD``."""
    what = f"frame {row['frame_id']} DEAD" if row["event"] == "dead" else row["event"]
    name = " ".join(str(row.get("job") or "").split())
    return f"cuectl: job {row['job_id']} {name} {what}"


def email_message(row: dict[str, Any], job: dict[str, Any], sender: str | None = None) -> bytes:
    counts = ", ".join(f"{k} {v}" for k, v in sorted((job.get("frame_counts") or {}).items())) or "none"
    lines = [
        f"To: {row['target']}",
        f"Subject: {subject(row)}",
        "Content-Type: text/plain; charset=utf-8",
        "MIME-Version: 1.0",
        "Auto-Submitted: auto-generated",
    ]
    if sender:
        lines.insert(0, f"From: {sender}")
    body = [
        subject(row),
        "",
        f"job:      {job.get('id')} {job.get('name')}",
        f"user:     {job.get('user')}",
        f"state:    {job.get('state')} ({job.get('outcome') or '-'})",
        f"frames:   {counts}",
        f"finished: {job.get('finished_at') or '-'}",
    ]
    if row["event"] == "dead":
        body.append(f"frame:    {row['frame_id']} (cuectl frame show {row['frame_id']})")
    body += ["", f"cuectl job show {job.get('id')}"]
    return ("\n".join(lines) + "\n\n" + "\n".join(body) + "\n").encode()


# A child that switches to another user enters its directory as that user (as frames do,
# run/frame/start.py ``_ENTER``): ``subprocess`` changes directory before it drops root, so a
# hook would be started in any directory of the host. $1: the directory; "/" if the user
# may not enter it (a hook needs no particular one).
_ENTER_AS_USER = 'cd -P -- "$1" 2>/dev/null || cd /; shift; exec "$@"'


def _run_child(
    argv: list[str], *, stdin: bytes, env: dict[str, str], timeout: float, run_as: launch.RunAs | None, cwd: str | None
) -> tuple[int | None, str]:
    """Run ``argv`` in its own session, feed ``stdin``, wait up to ``timeout``; (exit code or
    None on timeout, the tail of its output). With ``run_as`` it runs as that user, who
    enters ``cwd`` (else it starts in this process's directory)."""
    kwargs = run_as.popen_kwargs() if run_as else {}
    if run_as is not None and cwd is not None:
        where = cwd if cwd.startswith("/") else "/"  # never a relative path, searched on a CDPATH
        argv, cwd = ["/bin/sh", "-c", _ENTER_AS_USER, "cuectl", where, *argv], None
    with launch.CWD_LOCK:  # not while the worker is in a frame's directory for an instant (frame/start.py)
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
            close_fds=True,
            **kwargs,
        )
    launch.hold_child(proc.pid, proc)
    try:
        try:
            out, _ = proc.communicate(stdin, timeout=timeout)
        except BrokenPipeError:  # it did not read its stdin: fine
            out = b""
            proc.wait(timeout=timeout)
        return proc.returncode, out.decode(errors="replace")[-300:]
    except subprocess.TimeoutExpired:
        _stop(proc)
        return None, ""
    finally:
        launch.release_child(proc.pid, proc)


def _stop(proc: "subprocess.Popen[bytes]") -> None:
    """Kill a child's process group and reap the child, without reading its output to the
    end: a descendant in a session of its own (``setsid cmd &``) escapes the kill and would
    hold the pipe open for as long as it lives."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    for pipe in (proc.stdin, proc.stdout):
        try:
            if pipe is not None:
                pipe.close()
        except OSError:
            pass
    try:
        proc.wait(timeout=_REAP_S)
    except subprocess.TimeoutExpired:
        pass  # (unkillable for now, in the kernel: reaped by the worker's zombie reaping later)


class Deliverer:
    """Claims and delivers due notifications; one per worker (or per ``admin notify deliver``).

    ``run_as_submitter``: this process is root and runs hooks as the job's user, on proof
    (the worker's ``--run-as-worker-user`` turns it off, as for frames)."""

    def __init__(
        self,
        store: Store,
        *,
        deliverer_id: str,
        run_as_submitter: bool = False,
        interval_s: float = 5.0,
        batch: int = 8,
        warn: Callable[[str], None] | None = None,
        on_claimed: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.id = deliverer_id
        self.run_as_submitter = run_as_submitter
        self.interval_s = interval_s
        self.batch = batch
        self.warn = warn
        self.on_claimed = on_claimed  # test hook: the chaos tests die here, claims held
        self.inflight: dict[int, _Delivery] = {}
        self.next_claim = 0.0
        self.delivered = 0
        self.failed = 0

    # -- the loop's side -------------------------------------------------------------------
    def step(self, now: float, *, claim: bool = True, force: bool = False) -> None:
        """Record finished deliveries; when due (every ``interval_s``, or ``force``) claim
        and start more. Never blocks."""
        self._collect(now)
        if not claim or (now < self.next_claim and not force) or len(self.inflight) >= self.batch:
            return
        self.next_claim = now + self.interval_s
        rows = self.store.claim_notifications(self.id, now=now, limit=self.batch - len(self.inflight), lease_s=CLAIM_S)
        if rows and self.on_claimed:
            self.on_claimed()
        for row in rows:
            self._start(row)

    def drain(self, timeout: float) -> None:
        """Wait (up to ``timeout``, and no delivery past its own limit) for the deliveries in
        flight and record them."""
        deadline = time.monotonic() + timeout
        for d in list(self.inflight.values()):
            if d.thread.is_alive():  # (one that failed before it started has a thread never started)
                d.thread.join(max(0.0, min(deadline, d.deadline) - time.monotonic()))
        self._collect(self.store.clock())

    def run_once(self, now: float) -> tuple[int, int]:
        """``cuectl admin notify deliver``: claim what is due, deliver it, record it;
        (delivered, failed)."""
        self.step(now, force=True)
        self.drain(max(_LIMIT_S.values()) + _MARGIN_S)
        return self.delivered, self.failed

    def _collect(self, now: float) -> None:
        """Record each delivery that ended or ran out of time (its thread is left behind: a
        daemon, it cannot keep a draining worker from exiting)."""
        for nid, d in list(self.inflight.items()):
            overdue = d.overdue(time.monotonic())
            if d.thread.is_alive() and overdue is None:
                continue
            error = overdue or (d.result[0] if d.result else "the delivery thread ended without a result")
            try:
                if error is None:
                    self.store.notification_delivered(nid, self.id, now=now)
                    self.delivered += 1
                else:
                    self.store.notification_failed(nid, self.id, error, now=now, give_up=d.permanent)
                    self.failed += 1
                    if self.warn:
                        self.warn(
                            f"notification {nid} ({d.row['event']} of job {d.row['job_id']} to "
                            f"{d.row['kind']}) failed: {error}"
                        )
            except StoreError:
                return  # recorded on a later step (the claim still holds)
            del self.inflight[nid]

    def _start(self, row: dict[str, Any]) -> None:
        d = _Delivery(row=row, thread=threading.Thread(target=lambda: None))
        try:
            job = self.store.get_job(row["job_id"])
            job.pop("receipt", None)  # the store's bookkeeping, as `job show --json` leaves it out
            job["notification"] = {"id": row["id"], "event": row["event"], "frame_id": row["frame_id"]}
            work = self._prepare(row, job)
        except _Permanent as exc:
            d.permanent = True
            d.result.append(str(exc))
            self.inflight[row["id"]] = d
            return
        except CuectlError as exc:
            d.result.append(exc.message)
            self.inflight[row["id"]] = d
            return

        def run() -> None:
            try:
                d.result.append(work())
            except Exception as exc:  # noqa: BLE001 - any failure is a failed try, recorded
                d.result.append(f"{type(exc).__name__}: {exc}")

        d.thread = threading.Thread(target=run, name=f"cuectl-notify-{row['id']}", daemon=True)
        d.deadline = time.monotonic() + _LIMIT_S.get(row["kind"], WEBHOOK_TIMEOUT_S) + _MARGIN_S
        self.inflight[row["id"]] = d
        d.thread.start()

    # -- what each kind does ---------------------------------------------------------------
    def _prepare(self, row: dict[str, Any], job: dict[str, Any]) -> Callable[[], str | None]:
        """Check what can be checked now (on the loop's thread); return the blocking part."""
        body = json.dumps(job).encode()
        kind, target = row["kind"], row["target"]
        if kind not in _LIMIT_S:
            raise _Permanent(f"unknown notification kind {kind!r}")
        _recheck(kind, target)
        if kind == "webhook":
            # Sent by this process (root, on a root worker): only ever to the http(s) URL
            # just checked, and redirected only to another (docs/security.md, "Notifications").
            return lambda: _post(target, body, row)
        run_as = self._account(row, target if kind == "command" else None)
        if kind == "email":
            message = email_message(row, job)
            argv = [config.sendmail_path(), "-t", "-i"]
            env = {k: v for k, v in config.inherited_environ().items() if k not in _SECRETS}
            env.update(run_as.env() if run_as else {})
            return lambda: _email(argv, message, env, run_as)
        env = {k: v for k, v in config.inherited_environ().items() if not k.startswith("CUE_") and k not in _SECRETS}
        env.update(run_as.env() if run_as else {})
        env.update(
            {
                "CUE_JOB_ID": str(row["job_id"]),
                "CUE_JOB": str(row.get("job") or ""),
                "CUE_EVENT": row["event"],
                "CUE_FRAME_ID": str(row["frame_id"] or ""),
                "CUE_USER": str(row.get("user") or ""),
                "CUE_NOTIFICATION_ID": str(row["id"]),
            }
        )
        cwd = run_as.home if run_as else None
        return lambda: _command(target, body, env, run_as, cwd)

    def _account(self, row: dict[str, Any], command: str | None) -> launch.RunAs | None:
        """Whom a command hook (``command``) or sendmail (None) runs as: this process's user,
        or (root) the job's proven user — for a hook, one the user submitted."""
        if not self.run_as_submitter:
            return None
        what = "run" if command is not None else "sent"
        try:
            if command is not None:
                identity.check_notify_command(
                    user=row["user"],
                    job_id=row["job_id"],
                    command=command,
                    submitted_by=row.get("submitted_by"),
                    receipt=row.get("receipt"),
                    spool=self.store.receipt_dir,
                )
            else:
                problem = identity.proof_problem(
                    user=row["user"],
                    job_id=row["job_id"],
                    submitted_by=row.get("submitted_by"),
                    receipt=row.get("receipt"),
                    spool=self.store.receipt_dir,
                )
                if problem:
                    raise Unproven(problem)
            return launch.RunAs.lookup(row["user"])
        except Unproven as exc:
            raise _Permanent(f"not {what} as {row['user']}, and never as root: {exc.message}") from None
        except CuectlError as exc:  # no such user here
            raise _Permanent(exc.message) from None


def _recheck(kind: str, target: Any) -> None:
    """The target as submit checks it (sched/notify.py), whatever the row says: a row
    written straight into the store never makes a deliverer open a file, a FIFO or an
    ftp:// URL, nor write a header into a message. Such a row is given up at once."""
    try:
        nt.check_target(kind, target, kind)
    except InvalidInput as exc:
        raise _Permanent(f"refused at delivery: {exc.message}") from None


def _post(url: str, body: bytes, row: dict[str, Any]) -> str | None:
    # Imported here: urllib.request brings http.client, ssl and email (~20 ms), which every
    # worker would pay at start-up for webhooks most farms never set.
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "User-Agent": "cuectl-notify",
            "X-Cuectl-Event": row["event"],
            "X-Cuectl-Notification": str(row["id"]),
        },
    )
    try:
        with _opener().open(request, timeout=WEBHOOK_TIMEOUT_S) as response:
            status = int(response.status)
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code} from {nt.mask_url(url)}" + (f": {exc.reason}" if exc.code in _REDIRECTS else "")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"POST {nt.mask_url(url)}: {reason}"
    return None if 200 <= status < 300 else f"HTTP {status} from {nt.mask_url(url)}"


_REDIRECTS = (301, 302, 303, 307, 308)


def _opener() -> Any:
    """An opener for http and https alone (urllib's default one also opens file://, ftp://
    and data: URLs, and follows redirects to ftp://), with the environment's proxies, that
    follows a redirect only to another http(s) URL a submit would accept."""
    import urllib.request

    class Redirects(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
            try:
                nt.check_target("webhook", newurl, "redirect")
            except InvalidInput:
                import urllib.error

                raise urllib.error.HTTPError(
                    req.full_url,
                    code,
                    f"redirect to {newurl[:200]!r} not followed (only http:// and https://)",
                    headers,
                    fp,
                ) from None
            return super().redirect_request(req, fp, code, msg, headers, newurl)

    opener = urllib.request.OpenerDirector()
    for handler in (
        urllib.request.ProxyHandler(),
        urllib.request.HTTPHandler(),
        urllib.request.HTTPSHandler(),
        Redirects(),
        urllib.request.HTTPDefaultErrorHandler(),
        urllib.request.HTTPErrorProcessor(),
    ):
        opener.add_handler(handler)
    return opener


def _command(
    command: str, body: bytes, env: dict[str, str], run_as: launch.RunAs | None, cwd: str | None
) -> str | None:
    code, out = _run_child(
        ["/bin/sh", "-c", command], stdin=body, env=env, timeout=COMMAND_TIMEOUT_S, run_as=run_as, cwd=cwd
    )
    if code is None:
        return f"command timed out after {COMMAND_TIMEOUT_S:g} s"
    if code != 0:
        tail = " ".join(out.split())[-200:]
        return f"command exited {code}" + (f": {tail}" if tail else "")
    return None


def _email(argv: list[str], message: bytes, env: dict[str, str], run_as: launch.RunAs | None) -> str | None:
    if not Path(argv[0]).exists():
        return f"no sendmail at {argv[0]} (set CUECTL_SENDMAIL)"
    code, out = _run_child(
        argv, stdin=message, env=env, timeout=EMAIL_TIMEOUT_S, run_as=run_as, cwd=run_as.home if run_as else None
    )
    if code is None:
        return f"sendmail timed out after {EMAIL_TIMEOUT_S:g} s"
    if code != 0:
        return f"sendmail exited {code}: {' '.join(out.split())[-200:]}"
    return None
