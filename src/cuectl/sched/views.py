"""Rows to the JSON shapes of DESIGN §9, shared by every store backend.

Keys here are the stable contract of ``--json``: add keys, never rename them. Times are
ISO 8601 UTC, sizes bytes, durations seconds, unknown values ``null``.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping, Sequence

from cuectl.units import iso

# Environment variables whose values are masked in output unless asked (--show-secrets):
# names containing one of these words, the usual spellings of credentials.
# Case-insensitive; PAT (a personal access token: GITHUB_PAT) only as a whole word between
# underscores, so PATH and PATTERN stay visible; CRED (CREDS, AWS_CREDS, DB_CRED_FILE,
# dbCreds) only as the start of a word, so CREDIT and INCREDIBLE stay visible.
_SECRET_WORDS = re.compile(
    r"PASS|SECRET|TOKEN|KEY|CREDENTIAL|AUTH|PRIVATE|COOKIE|SESSION|(?:^|_)PAT(?:_|$)"
    r"|(?<![A-Z0-9])CREDS?(?![A-Z])",
    re.IGNORECASE,
)
_SECRET_CAMEL = re.compile(r"(?<=[a-z0-9])Creds?(?![a-z])")  # dbCreds, awsCred: case matters here
MASK = "***"

# Values that carry a credential whatever their variable's name (DATABASE_URL=postgresql://
# u:pw@db/x). Each rule is a shape no ordinary value has:
# - a URL's password (scheme://user:PASSWORD@host): only the password is masked, so the
#   value still says where it points (postgresql://u:***@db/x);
# - a URL's query parameter named by a credential's word (?access_token=, ?key=, ?apiKey=,
#   &X-Amz-Credential=, &X-Amz-Signature=, &sig=): only its value is masked;
# - a PEM private key (-----BEGIN ... PRIVATE KEY-----): the whole value is masked;
# - tokens with a vendor's documented prefix: GitHub (ghp_, gho_, ghu_, ghs_, ghr_,
#   github_pat_), AWS access key ids (AKIA/ASIA + 16), Slack (xoxb-, xoxp-, ...), Hugging
#   Face (hf_), and JSON Web Tokens (eyJ....eyJ....sig): the token is masked, text around it stays.
# Bounded where a value could make a pattern retry from many places (values are the
# submitter's, and masked by the API server): each stays linear in the value's length.
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]{0,31}://[^\s:/?#@]*):(?P<pw>[^\s/?#]+)@")
_URL_PARAM = re.compile(r"(?P<head>[?&;](?P<name>[A-Za-z0-9_.\-]+)=)(?P<value>[^&#;\s]+)")
_PEM_PRIVATE = re.compile(r"-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----")
_TOKENS = re.compile(
    r"(?<![A-Za-z0-9_])(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}"
    r"|(?:AKIA|ASIA)[A-Z0-9]{16}|xox[abposr]-[A-Za-z0-9-]{10,}|hf_[A-Za-z0-9]{30,}"
    r"|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]+)(?![A-Za-z0-9_])"
)


def looks_secret(name: str) -> bool:
    """Does an environment variable's name look like it holds a secret (``*_TOKEN``, …)?"""
    return bool(_SECRET_WORDS.search(name) or _SECRET_CAMEL.search(name))


_PARAM_WORDS = frozenset(
    {
        "password",
        "passwd",
        "pwd",
        "pass",
        "secret",
        "token",
        "key",
        "apikey",
        "credential",
        "credentials",
        "cred",
        "creds",
        "auth",
        "authorization",
        "signature",
        "sig",
    }
)


def _secret_param(name: str) -> bool:
    """A URL query parameter that holds a credential: one of its words (split at ``_``, ``-``,
    ``.`` and camelCase) is a credential's (``access_token``, ``apiKey``, ``X-Amz-Signature``,
    ``sig``). Whole words, unlike the name rule: ``?author=`` and ``?monkey=`` are ordinary."""
    words = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name).replace("_", " ").replace("-", " ").replace(".", " ")
    return any(word in _PARAM_WORDS for word in words.lower().split())


def mask_value(value: Any) -> Any:
    """``value`` with the credentials it carries masked (the value rules above); anything
    else, and a value that is not a string, as it is."""
    if not isinstance(value, str):
        return value
    if _PEM_PRIVATE.search(value):
        return MASK
    if "://" in value:
        value = _URL_PASSWORD.sub(lambda mt: f"{mt['head']}:{MASK}@", value)
        value = _URL_PARAM.sub(lambda mt: mt["head"] + MASK if _secret_param(mt["name"]) else mt[0], value)
    return _TOKENS.sub(MASK, value)


def mask_env(env: Mapping[str, Any]) -> dict[str, Any]:
    """The env with secret values masked (names stay visible): the whole value of a
    secret-looking name is ``***``; any other value has the credentials it carries masked
    (``mask_value``)."""
    return {k: (MASK if looks_secret(k) else mask_value(v)) for k, v in env.items()}


def _loads(value: Any, default: Any) -> Any:
    if value is None or value == "":
        return default
    return json.loads(value) if isinstance(value, str) else value


def job_outcome(state: str, killed_at: float | None, frame_counts: Mapping[str, int]) -> str | None:
    """How a FINISHED job ended (None while it is not): KILLED by ``job kill``, FAILED with
    DEAD frames, else SUCCEEDED (every frame succeeded or was eaten)."""
    if state != "FINISHED":
        return None
    if killed_at is not None:
        return "KILLED"
    return "FAILED" if frame_counts.get("DEAD") else "SUCCEEDED"


def job_display_state(state: str, outcome: str | None, frame_counts: Mapping[str, int]) -> str:
    """The one word text views show for a job: how a finished one ended, RUNNING while any
    of its frames runs, else PENDING. ``state`` stays OpenCue's (PENDING covers a job with
    running frames), which read as if nothing ran."""
    if outcome is not None:
        return outcome
    if state != "FINISHED" and frame_counts.get("RUNNING"):
        return "RUNNING"
    return state


def job_json(row: Mapping[str, Any], frame_counts: Mapping[str, int]) -> dict[str, Any]:
    outcome = job_outcome(row["state"], row["killed_at"], frame_counts)
    return {
        "id": row["id"],
        "name": row["name"],
        "user": row["user"],
        "submitted_by": row["submitted_by"],
        "priority": row["priority"],
        "state": row["state"],
        "paused": bool(row["paused"]),
        "created_at": iso(row["created_at"]),
        "finished_at": iso(row["finished_at"]),
        "outcome": outcome,
        "display_state": job_display_state(row["state"], outcome, frame_counts),
        # Why a FAILED job failed ("1 frame killed by alice"); the store fills it in.
        "outcome_reason": None,
        "project": row["project"],
        "show": row["show"],
        "shot": row["shot"],
        "max_running": row["max_running"],
        "max_cores": row["max_cores"],
        "max_gpus": row["max_gpus"],
        "frame_counts": dict(frame_counts),
        "pending_reason": None,
    }


def layer_json(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"],
        "name": row["name"],
        "command": _loads(row["command"], []),
        "range": row["range"],
        "chunk": row["chunk"],
        "gpus": row["gpus"],
        "gpu_vendor": row["gpu_vendor"],
        "gpu_models": _loads(row["gpu_models"], []),
        "gpu_memory_min_bytes": row["gpu_memory_min_bytes"],
        "gpu_capability_min": row["gpu_capability_min"],
        "gpu_driver_min": row["gpu_driver_min"],
        "gpu_cuda_min": row["gpu_cuda_min"],
        "cores": row["cores"],
        "memory_bytes": row["memory_bytes"],
        "retries": row["retries"],
        "timeout_s": row["timeout_s"],
        "tags": _loads(row["tags"], []),
        "depends": _loads(row["depends"], []),
        "env": _loads(row["env"], {}),
        "log_limit_bytes": row["log_limit_bytes"],
        "max_running": row["max_running"],
        "limits": _loads(row["limits"], []),
        "retry_delay_s": row["retry_delay_s"],
        "retry_on_gpu_oom": row["retry_on_gpu_oom"] or "same",
        # GPU policies (docs/gpu-health.md); None: the worker's own setting.
        "gpu_escape": row["gpu_escape"],
        "gpu_idle_limit_s": row["gpu_idle_limit_s"],
        "gpu_idle_action": row["gpu_idle_action"],
        "gpu_idle_util": row["gpu_idle_util"],
        "gpu_share_bytes": row["gpu_share_bytes"],
        "gpu_share_enforce": row["gpu_share_enforce"],
        "cwd": row["cwd"],
    }


def frame_name(number: int, layer: str) -> str:
    """OpenCue frame names: zero-padded number, dash, layer (``0001-render``). A number that
    is not an integer (SQLite keeps any value in an INTEGER column: a hostile writer of the
    store) is shown as it is (``x-render``), never an error that breaks every listing."""
    if type(number) is not int:
        return f"{number}-{layer}"
    return f"{number:04d}-{layer}"


def frame_json(row: Mapping[str, Any]) -> dict[str, Any]:
    running = row["state"] == "RUNNING"
    return {
        "id": row["id"],
        "job_id": row["job_id"],
        "job": row["job_name"],
        "layer": row["layer_name"],
        "number": row["number"],
        "frames": row["frames"],
        "name": frame_name(row["number"], row["layer_name"]),
        "state": row["state"],
        "attempts": row["attempts"],
        "host": row["host"],
        "gpu_uuids": _loads(row["gpu_uuids"], []),
        "exit_code": row["exit_code"],
        "exit_signal": row["exit_signal"],
        "started_at": iso(row["started_at"]),
        "ended_at": iso(row["ended_at"]),
        "gpu_util_mean_pct": row["gpu_util_mean_pct"],
        "gpu_util_max_pct": row["gpu_util_max_pct"],
        "gpu_memory_peak_bytes": row["gpu_memory_peak_bytes"],
        "gpu_seconds": row["gpu_seconds"],
        "max_rss_bytes": row["max_rss_bytes"],
        "pending_action": row["action"],
        # Why its latest attempt failed (None once it succeeds), and when a failed frame
        # may run again (its retry back-off; None: at once).
        "failure": row["failure"],
        "retry_at": iso(row["retry_at"]) if row["state"] == "WAITING" else None,
        # The total memory of the device it last ran out of GPU memory on, when its layer
        # says ``retry_on_gpu_oom: bigger``: it runs again only on bigger ones (None: never).
        "gpu_oom_bytes": row["gpu_oom_bytes"],
        # A RUNNING frame's latest sample (the worker writes it every --sample-interval):
        # mean utilisation over its devices, the most memory on any one, and when.
        "gpu_util_pct": row["gpu_util_pct"] if running else None,
        "gpu_memory_used_bytes": row["gpu_memory_used_bytes"] if running else None,
        "gpu_sampled_at": iso(row["gpu_sampled_at"]) if running else None,
    }


def samples_json(series: Mapping[str, Sequence[Sequence[Any]]]) -> dict[str, list[list[Any]]]:
    """An attempt's stored GPU series (``{uuid: [[t, util, mem], ...]}``, t in epoch
    seconds) as ``--json`` shows it: the same triples, t as ISO 8601 UTC. Triples rather
    than objects: up to 120 points per device, and a chart reads them by position."""
    return {uuid: [[iso(point[0]), *point[1:]] for point in points] for uuid, points in series.items()}


def attempt_json(row: Mapping[str, Any]) -> dict[str, Any]:
    """One finished attempt of a frame with its GPU usage (``frame show``'s
    ``attempt_history``, and the API's per-attempt view)."""
    return {
        "attempt": row["attempt"],
        "host": row["host"],
        "outcome": row["outcome"],
        "started_at": iso(row["started_at"]),
        "ended_at": iso(row["ended_at"]),
        "exit_code": row["exit_code"],
        "exit_signal": row["exit_signal"],
        "timed_out": bool(row["timed_out"]),
        "failure_kind": row["failure_kind"],
        "failure": row["failure"],
        "gpu_uuids": _loads(row["gpu_uuids"], []),
        "gpu_util_mean_pct": row["gpu_util_mean_pct"],
        "gpu_util_max_pct": row["gpu_util_max_pct"],
        "gpu_memory_peak_bytes": row["gpu_memory_peak_bytes"],
        "gpu_seconds": row["gpu_seconds"],
        # Device-seconds held idle past the layer's gpu_idle_limit (None: no idle rule applied).
        "gpu_idle_seconds": row["gpu_idle_seconds"],
    }


def _live_json(value: Any) -> Any:
    """The worker's last device sample as stored (``{"at": epoch, "devices": [...]}``),
    with ``at`` as ISO 8601 UTC like every other time."""
    live = _loads(value, None)
    if isinstance(live, dict) and isinstance(live.get("at"), (int, float)):
        live = {**live, "at": iso(live["at"])}
    return live


# The key of a host's live document that says its worker stopped cleanly and signed off
# (``Store.sign_off_host``): the host is DOWN from then, not ``down_after`` later.
SIGNED_OFF = "signed_off"


def host_json(row: Mapping[str, Any], *, now: float, down_after: float) -> dict[str, Any]:
    raw = _loads(row["live"], None)
    # Signed off, unless a worker has registered or beaten for the host since (both move
    # last_heartbeat past the mark's time, whether or not they send a live document).
    signed_off = (
        isinstance(raw, dict)
        and raw.get(SIGNED_OFF) is True
        and isinstance(raw.get("at"), (int, float))
        and raw["at"] >= row["last_heartbeat"]
    )
    up = not signed_off and (now - row["last_heartbeat"]) <= down_after
    live = _live_json(row["live"])
    return {
        "name": row["name"],
        "state": "UP" if up else "DOWN",
        "locked": bool(row["locked"]),
        "last_heartbeat": iso(row["last_heartbeat"]),
        "cores": row["cores"],
        "memory_bytes": row["memory_bytes"],
        "gpus": _loads(row["gpus"], []),
        "tags": _loads(row["tags"], []),
        "worker_pid": row["worker_pid"],
        "version": row["version"],
        "live": live,
    }
