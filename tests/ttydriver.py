"""Run a command on a pseudo-terminal, as a person at a terminal would (tests/ is on sys.path)."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import termios
import time


def on_terminal(
    argv: list[str],
    *,
    answer: bytes | None,
    prompt: bytes = b"[y/N]",
    columns: int | None = None,
    env: dict[str, str] | None = None,
) -> tuple[int, str]:
    """Run ``argv`` with a pty as its stdin, stdout and stderr; type ``answer`` once it has
    printed ``prompt`` (a ``[y/N]`` question unless told). ``columns``: the terminal's width,
    set on the pty itself as a resized window would (the caller's env should not carry
    ``COLUMNS``). Its exit code and everything it printed (newlines as ``\\n``)."""
    master, slave = pty.openpty()
    try:
        if columns is not None:
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
        proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, start_new_session=True, env=env)
        out = bytearray()
        answered = False
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    out.extend(os.read(master, 65536))
                except OSError:
                    break
            elif proc.poll() is not None:
                break
            if answer is not None and not answered and prompt in out:
                os.write(master, answer)
                answered = True
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        return proc.returncode, out.decode("utf-8", "replace").replace("\r\n", "\n")
    finally:
        os.close(master)
        os.close(slave)
