"""Notification entries (``notify:`` in a job spec, the ``--notify-*`` flags, the farm
defaults): validation, their JSON form, and which event a finished job raises.

Delivery lives in ``cuectl.run.notify``; recording (one row per event and target, in the
transaction that finishes the job or kills the frame) in the store. docs/notifications.md.
"""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any, Iterable, Mapping, Sequence

from cuectl.errors import InvalidInput
from cuectl.sched.model import NOTIFY_EVENTS, NOTIFY_KINDS, Notify

DEFAULT_ON = ("finished", "failed")
MAX_ENTRIES = 20
MAX_TARGET = 4096
_EMAIL_RE = re.compile(r"[^@\s<>,;\"'()\\]+@[^@\s<>,;\"'()\\]+")
_KEYS = ("on", *NOTIFY_KINDS)


def _describe(value: Any) -> str:
    return type(value).__name__ if not isinstance(value, (str, int, float, bool)) else repr(value)


def _has_control(value: str) -> bool:
    """C0 and C1 controls, DEL, and format characters (bidi overrides, zero-width ones)."""
    return any(unicodedata.category(c) in ("Cc", "Cf") for c in value)


def check_target(kind: str, value: Any, label: str) -> str:
    """A target of ``kind``, or ``InvalidInput`` naming ``label``. Checked at submit and
    again by the deliverer, whatever the stored row says (run/notify.py)."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(f"{label}: expected a non-empty string, got {_describe(value)}")
    if len(value) > MAX_TARGET:
        raise InvalidInput(f"{label}: at most {MAX_TARGET} characters")
    if "\x00" in value:
        raise InvalidInput(f"{label}: contains a NUL character")
    if kind == "webhook":
        from urllib.parse import urlsplit

        try:
            parts = urlsplit(value)
        except ValueError as exc:
            raise InvalidInput(f"{label}: {value!r} is not a URL ({exc})") from None
        if (
            parts.scheme not in ("http", "https")
            or not parts.hostname
            or any(c.isspace() for c in value)
            or _has_control(value)
        ):
            raise InvalidInput(f"{label}: {value!r} is not an http:// or https:// URL")
    elif kind == "email":
        # The address becomes the To: header of a message sendmail -t reads its recipients
        # from: a CR or LF (or any other control) would add a header, e.g. a Bcc.
        if not _EMAIL_RE.fullmatch(value) or _has_control(value):
            raise InvalidInput(f"{label}: {value!r} is not an email address (user@host)")
    elif kind == "command":
        if any(ord(c) < 32 and c not in "\t\n" for c in value):
            raise InvalidInput(f"{label}: contains a control character")
    else:  # pragma: no cover - callers pass NOTIFY_KINDS
        raise InvalidInput(f"{label}: unknown kind {kind!r}")
    return value


def check_events(value: Any, label: str) -> tuple[str, ...]:
    """``on:``: one event or a list of them (finished, failed, dead), in a stable order."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items:
        raise InvalidInput(f"{label}: expected one or more of {', '.join(NOTIFY_EVENTS)}")
    out = []
    for item in items:
        event = item.strip().lower() if isinstance(item, str) else item
        if event not in NOTIFY_EVENTS:
            raise InvalidInput(f"{label}: {_describe(item)} is not one of {', '.join(NOTIFY_EVENTS)}")
        out.append(event)
    return tuple(e for e in NOTIFY_EVENTS if e in out)


def entry(value: Any, label: str) -> Notify:
    """One entry: a mapping with ``on`` (optional) and exactly one target key."""
    if isinstance(value, Notify):
        return entry(value.to_json(), label)
    if not isinstance(value, Mapping):
        raise InvalidInput(
            f"{label}: expected a mapping such as {{webhook: https://…, on: [failed]}}, got {_describe(value)}"
        )
    unknown = [k for k in value if k not in _KEYS]
    if unknown:
        raise InvalidInput(f"{label}: unknown key {unknown[0]!r} (expected {', '.join(_KEYS)})")
    kinds = [k for k in NOTIFY_KINDS if value.get(k) is not None]
    if len(kinds) != 1:
        raise InvalidInput(
            f"{label}: exactly one of {', '.join(NOTIFY_KINDS)} per entry"
            + (f" (got {', '.join(kinds)})" if kinds else "")
        )
    kind = kinds[0]
    on = DEFAULT_ON if value.get("on") is None else check_events(value["on"], f"{label}.on")
    return Notify(kind=kind, target=check_target(kind, value[kind], f"{label}.{kind}"), on=on)


def entries(value: Any, label: str = "notify") -> tuple[Notify, ...]:
    """The ``notify:`` list (a single mapping counts as a list of one)."""
    if value is None:
        return ()
    items = [value] if isinstance(value, (Mapping, Notify)) else value
    if not isinstance(items, (list, tuple)):
        raise InvalidInput(f"{label}: expected a list of entries, got {_describe(value)}")
    if len(items) > MAX_ENTRIES:
        raise InvalidInput(f"{label}: at most {MAX_ENTRIES} entries (got {len(items)})")
    out: list[Notify] = []
    for i, item in enumerate(items):
        one = entry(item, f"{label}[{i}]")
        if one not in out:
            out.append(one)
    return tuple(out)


def from_flags(
    *, commands: Sequence[str] = (), webhooks: Sequence[str] = (), emails: Sequence[str] = (), on: Sequence[str] = ()
) -> tuple[Notify, ...]:
    """The entries of ``--notify-command/--notify-webhook/--notify-email`` with ``--notify-on``
    (one event list for all of them; default finished, failed)."""
    events = check_events(list(on), "--notify-on") if on else DEFAULT_ON
    out: list[Notify] = []
    for kind, flag, values in (
        ("command", "--notify-command", commands),
        ("webhook", "--notify-webhook", webhooks),
        ("email", "--notify-email", emails),
    ):
        for value in values:
            out.append(Notify(kind=kind, target=check_target(kind, value, flag), on=events))
    if on and not out:
        raise InvalidInput("--notify-on: give --notify-command, --notify-webhook or --notify-email too")
    return entries(out, "notify")


def to_json(items: Iterable[Notify]) -> str:
    """The stored form (jobs.notify, the farm defaults): a JSON list of entries."""
    return json.dumps([n.to_json() for n in items], sort_keys=True)


def from_json(text: str | None) -> tuple[Notify, ...]:
    """Stored entries; anything unreadable (a hand-edited store) counts as none."""
    try:
        return entries(json.loads(text or "[]"))
    except (ValueError, InvalidInput):
        return ()


def target_json(item: Notify) -> str:
    """A notification row's ``target``: the kind and the target, canonical JSON (part of the
    row's unique key, so the same target is recorded once per event)."""
    return json.dumps({"kind": item.kind, "target": item.target}, sort_keys=True, separators=(",", ":"))


def masked(item: Notify) -> dict[str, object]:
    """An entry as others may see it (``job show``): a webhook URL often carries a secret
    (chat services put the token in the path), so only its scheme and host are shown."""
    data = item.to_json()
    if item.kind == "webhook":
        data["webhook"] = mask_url(item.target)
    return data


def mask_url(url: str) -> str:
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "***"
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{host}{port}/***"


def job_event(outcome: str | None) -> str | None:
    """The event a job that just finished with ``outcome`` raises: SUCCEEDED → finished,
    FAILED or KILLED → failed."""
    if outcome == "SUCCEEDED":
        return "finished"
    if outcome in ("FAILED", "KILLED"):
        return "failed"
    return None
