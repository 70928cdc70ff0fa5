"""A lease holder for the tests, speaking one JSON line per event on stdout.

    python lease_child.py '{"gpus": 1, "wait": false, "hold": true, ...}'

Takes ``cuectl.lease(**params)`` (``hold`` and ``release_on`` are ours), prints
``{"event": "acquired", "uuids": [...], "env": {...}, "pid": N}``, then — with ``hold`` —
waits for a line on stdin: ``release`` releases and says ``released``, then the next line
(or EOF) ends the process; EOF at once ends it while still holding. A lease error prints
``{"event": "error", "type": ..., "message": ..., "holders": [...]}`` and exits with the
error's exit code. ``waiting`` is printed once the child is queued (``wait=True``).
"""

from __future__ import annotations

import json
import os
import sys


def say(**event) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def main() -> int:
    params = json.loads(sys.argv[1])
    hold = params.pop("hold", True)
    import cuectl
    from cuectl.errors import LeaseError

    try:
        held = cuectl.lease(on_wait=lambda exc: say(event="waiting", message=exc.message), **params)
    except LeaseError as exc:
        say(event="error", type=type(exc).__name__, message=exc.message, holders=getattr(exc, "holders", []))
        return exc.exit_code
    say(event="acquired", uuids=list(held.uuids), env=held.env, pid=os.getpid())
    if hold:
        command = sys.stdin.readline().strip()
        if command == "release":
            held.release()
            say(event="released")
            sys.stdin.readline()
    return 0


if __name__ == "__main__":
    sys.exit(main())
