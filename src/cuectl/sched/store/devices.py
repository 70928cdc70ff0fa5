"""Device states (docs/gpu-health.md): the pure parts of ``Store.device_states``,
``set_device_state``, ``drain_device`` and ``undrain_device`` that both SQL backends share —
reasons cleaned, a device named by uuid or index, a host's devices shown with their state.

A device without a ``device_states`` row is ok. Values come from clients (a drain's
reason, a worker's Xid text), are shown in terminals and the web monitor, and a SQLite
file can be written by anyone who may write it: they are cleaned when written and again
when read.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from cuectl.errors import InvalidInput, NotFound
from cuectl.sched.store.base import DEVICE_REASON_MAX, DEVICE_STATES, DeviceState


def clean_text(value: object, limit: int = DEVICE_REASON_MAX) -> str | None:
    """Printable text on one line, at most ``limit`` characters (``…`` where it was cut);
    None for nothing. Control characters (escape sequences, newlines) become spaces."""
    if value is None:
        return None
    text = " ".join("".join(c if c.isprintable() else " " for c in str(value)).split())
    if not text:
        return None
    return text if len(text) <= limit else text[: limit - 1] + "…"


def person_reason(reason: str) -> str:
    """A reason given by a person (``gpu drain --reason``): required, one printable line,
    at most ``DEVICE_REASON_MAX`` characters; refused rather than changed."""
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidInput("--reason: required, why the device is drained (shown in `host show` and the web monitor)")
    text = reason.strip()
    if not text.isprintable():
        raise InvalidInput("--reason: one line of printable text (no control characters)")
    if len(text) > DEVICE_REASON_MAX:
        raise InvalidInput(f"--reason: at most {DEVICE_REASON_MAX} characters, got {len(text)}")
    return text


def check_state(state: str) -> None:
    if state not in DEVICE_STATES:
        raise InvalidInput(f"device state {state!r} is not one of {', '.join(DEVICE_STATES)}")


def from_row(r: Mapping[str, Any]) -> DeviceState:
    state = r["state"] if r["state"] in DEVICE_STATES else "drained"  # a hostile row is not ok
    return DeviceState(
        host=str(r["host"]),
        uuid=str(r["uuid"]),
        state=state,
        reason=clean_text(r["reason"]),
        since=r["since"] if isinstance(r["since"], (int, float)) else None,
        by_user=clean_text(r["by_user"], 100),
        automatic=bool(r["automatic"]),
    )


def resolve(host: str, gpus_json: str | None, device: str) -> str:
    """The uuid of ``device`` on ``host``: a uuid it registered, a unique prefix of one, or
    its index there. ``NotFound`` otherwise."""
    try:
        gpus = json.loads(gpus_json or "[]")
    except ValueError:
        gpus = []
    gpus = [g for g in gpus if isinstance(g, dict) and isinstance(g.get("uuid"), str)]
    text = str(device).strip()
    if text.isdigit():
        for g in gpus:
            if g.get("index") == int(text):
                return str(g["uuid"])
    exact = [g["uuid"] for g in gpus if g["uuid"] == text]
    if exact:
        return str(exact[0])
    prefix = [g["uuid"] for g in gpus if text and g["uuid"].startswith(text)]
    if len(prefix) == 1:
        return str(prefix[0])
    known = ", ".join(f"{g.get('index')} ({g['uuid']})" for g in gpus) or "none"
    raise NotFound(
        f"no device {clean_text(text, 80)!r} on host {host}"
        + (" (the prefix names several)" if len(prefix) > 1 else ""),
        hint=f"its devices: {known}",
    )


def with_states(host: Mapping[str, Any], states: Mapping[str, DeviceState]) -> dict[str, Any]:
    """A host's JSON with each device's ``state`` and ``reason`` (``host show``, ``host
    list``, the API), and since when and by whom where it has a state."""
    gpus = []
    for g in host.get("gpus") or []:
        if not isinstance(g, dict):
            gpus.append(g)
            continue
        s = states.get(str(g.get("uuid")))
        gpus.append(
            {
                **g,
                "state": s.state if s else "ok",
                "reason": s.reason if s and not s.in_service else None,
                "state_since": s.to_json()["since"] if s else None,
                "state_by": s.by_user if s else None,
                "state_automatic": bool(s and s.automatic),
            }
        )
    return {**host, "gpus": gpus}


def by_host(states: Sequence[DeviceState]) -> dict[str, dict[str, DeviceState]]:
    out: dict[str, dict[str, DeviceState]] = {}
    for s in states:
        out.setdefault(s.host, {})[s.uuid] = s
    return out
