"""A frame that ends while the database connection is open but silent (a stalled server, a
dead network path: tests/tcpproxy.py holds every byte) is recorded with its real end time,
which the worker knows, not the time its store call came back (issue 41 §7)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from farmlib import V100

psycopg = pytest.importorskip("psycopg", reason="the postgres extra (psycopg 3) is not installed")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tcpproxy  # noqa: E402


def test_a_frame_that_ends_during_a_stall_keeps_its_real_end_time(pg_farm) -> None:
    farm = pg_farm
    direct = farm.db
    farm.cuectl("admin", "migrate")
    job = farm.submit({"name": "j", "layers": [{"name": "r", "command": farm.probe("--sleep", "1.5"), "gpus": 1}]})
    proxy = tcpproxy.StallingProxy(farm.server.port)
    try:
        farm.db = proxy.url(direct.rsplit("/", 1)[1])  # the worker's connection goes through the proxy
        proc = farm.start_worker(farm.host("stalled", [V100]), "--name", "stalled", "--until-idle", lease="60")
        farm.db = direct
        farm.wait_for(lambda: farm.starts(), what="frame started")
        proxy.stall()  # the worker's next store call waits on a silent connection
        time.sleep(5)  # the frame ends after 1.5 s, while the worker waits
        proxy.resume()
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    finally:
        proxy.close()
    (frame,) = farm.frames(job)
    assert frame["state"] == "SUCCEEDED"
    with psycopg.connect(direct, autocommit=True) as conn:
        took = conn.execute("SELECT ended_at - started_at FROM attempts WHERE frame_id = %s", (frame["id"],)).fetchall()
    assert len(took) == 1 and 1.4 < took[0][0] < 3.0, took  # not the time the stalled call returned
