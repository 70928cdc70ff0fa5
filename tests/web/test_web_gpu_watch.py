"""What runs on the GPUs, in the web monitor (issue 39 §1, docs/gpu-health.md), in a real
browser against a real worker on fake GPUs: a host's page lists each device's processes
with their owner (the frame's, another program's), and a frame's panel lists the GPU events
its worker recorded (here an escape onto the device it was not given)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from webfarm import expect, login, wait_for

A100 = {"model": "NVIDIA A100-SXM4-80GB", "vendor": "NVIDIA", "memory": "80GiB"}
# Writes its own pid on the device it was NOT given (the other of two), then sleeps.
ESCAPE = (
    "import json, os, sys, time\n"
    "mine = int(os.environ['CUDA_VISIBLE_DEVICES'])\n"
    "entry = {'pid': os.getpid(), 'memory_used_bytes': 2 << 30}\n"
    "path = os.path.join(sys.argv[1], f'{1 - mine}.json')\n"
    "open(path + '.tmp', 'w').write(json.dumps({'utilization_pct': 20, 'memory_used_bytes': 2 << 30, "
    "'processes': [entry]}))\n"
    "os.replace(path + '.tmp', path)\n"
    "time.sleep(60)\n"
)


def test_the_host_page_lists_gpu_processes_and_the_frame_panel_its_gpu_events(farm, page):
    ada = farm.token("ada", "admin")
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # not run by cuectl
    try:
        fake = farm.fake_gpus("gpu-watch", [A100, A100])
        state = farm.base / "gpu-state-gpu-watch"
        worker = farm.start_worker(fake)
        job = farm.submit(
            ada, "web escape", {"name": "main", "command": [sys.executable, "-c", ESCAPE, str(state)], "gpus": 1}
        )
        wait_for(lambda: farm.request("GET", "/api/v1/hosts/gpu-watch", token=ada).status == 200, what="the host")
        login(page, farm, ada)
        page.goto(f"{farm.url}/#/hosts/gpu-watch")
        frame_proc = page.locator('#host-procs tr[data-owner="frame"]')
        expect(frame_proc.locator(".owner")).to_contain_text("(job web escape)", timeout=30_000)
        # Another program on the frame's own device: listed as foreign.
        (held,) = {0, 1} - {int(p.name.split(".")[0]) for p in state.glob("*.json")}
        (state / f"{held}.json").write_text(
            json.dumps(
                {
                    "utilization_pct": 5,
                    "memory_used_bytes": 1 << 30,
                    "processes": [{"pid": other.pid, "memory_used_bytes": 1 << 30}],
                }
            )
        )
        foreign = page.locator(f'#host-procs tr[data-pid="{other.pid}"]')
        expect(foreign.locator(".owner")).to_have_text("foreign (not run by cuectl)", timeout=30_000)
        expect(foreign.locator(".index")).to_have_text(str(held))

        page.goto(f"{farm.url}/#/jobs/{job['id']}")
        frames = page.locator("#frames-table tr[data-frame-id]")
        expect(frames.first.locator(".state")).to_have_text("RUNNING", timeout=30_000)
        frames.first.locator('button[data-action="log"]').click()
        events = page.locator("#gpu-events")
        expect(events.locator('tr[data-kind="escape"] .detail')).to_contain_text(
            "was not given, 2.0 GiB", timeout=30_000
        )
        expect(events.locator('tr[data-kind="foreign"] .detail')).to_contain_text(f"pid {other.pid}")
        farm.api("POST", f"/jobs/{job['id']}/kill", token=ada)
        assert worker.poll() is None

        # A device taken out of service shows so on the hosts page and the host's page, with why.
        with farm.store() as store:
            store.drain_device("gpu-watch", str(held), reason="Xid 79: GPU has fallen off the bus", now=time.time())
        page.goto(f"{farm.url}/#/hosts")
        row = page.locator('#hosts-table tr[data-host="gpu-watch"][data-device-state="drained"]')
        expect(row.locator(".state")).to_contain_text("gpu drained: Xid 79: GPU has fallen off the bus", timeout=30_000)
        page.goto(f"{farm.url}/#/hosts/gpu-watch")
        drained = page.locator('#host-gpus tr[data-device-state="drained"] .holder')
        expect(drained).to_have_text("drained: Xid 79: GPU has fallen off the bus", timeout=30_000)
    finally:
        other.kill()
        other.wait()
