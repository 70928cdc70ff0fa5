#!/usr/bin/env python3
"""Regenerate the web monitor's screenshots in docs/screenshots/ (docs/web.md shows them).

Builds a throwaway farm in a temporary directory: a SQLite store, a real `cuectl serve` on
127.0.0.1 (a free port), a `cuectl worker` on two fake 48 GB NVIDIA cards whose utilisation
and memory this script varies while frames run (src/cuectl/gpu/fake.py reads them from the
state directory), a second host of fake A100s, and a few jobs: finished, running on the
GPUs, waiting for a GPU no host has, and one with a dead frame. Then Debian's Chromium
(/usr/bin/chromium, or $CUECTL_CHROMIUM) takes, at 1280x800 unless said otherwise:

  login.png            the login page
  jobs.png             the jobs page of an admin, sorted by priority, two jobs selected
  job.png              a running job with a frame's log and GPU chart open
  hosts.png            the hosts page
  host.png             a host's page: its GPUs with holders, its running frames, Lock
  submit-error.png     the submit form refusing gpus = -1 beside the field
  viewer.png           a job as a viewer sees it (read-only badge, no action buttons)
  phone-jobs-dark.png  the jobs page on a 390x844 phone in dark mode

Usage: .venv/bin/python scripts/screenshots.py [--out DIR]    (takes about a minute)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("CUECTL_CHROMIUM") or "/usr/bin/chromium"
GIB = 1024**3
HOST = "127.0.0.1"


def cuectl() -> list[str]:
    exe = Path(sys.executable).with_name("cuectl")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "cuectl"]


class Farm:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.db = base / "store" / "cuectl.db"
        self.db.parent.mkdir(parents=True)
        self.env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("CUECTL_DB", "CUECTL_FAKE_GPUS", "CUECTL_LOG_DIR", "CUECTL_USER")
        }
        self.env.update(
            XDG_STATE_HOME=str(base / "state"),
            CUECTL_LOCK_DIR=str(base / "locks"),
            CUECTL_CREATE_LOCK_DIR="1",
            CUECTL_LOCK_REGISTRY=str(base / "lock-registry"),
            CUECTL_KILL_GRACE="0.5",
            NO_COLOR="1",
        )
        self.procs: list[subprocess.Popen] = []
        from cuectl.sched.store import open_store

        open_store(str(self.db), create=True).close()
        with socket.socket() as s:
            s.bind((HOST, 0))
            self.port = s.getsockname()[1]
        self.url = f"http://{HOST}:{self.port}"
        self.spawn(
            [*cuectl(), "--db", str(self.db), "serve", "--host", HOST, "--port", str(self.port), "--no-access-log"],
            self.env,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(self.url + "/healthz", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("cuectl serve did not start") from None
                time.sleep(0.05)

    def spawn(self, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = open(self.base / f"proc-{len(self.procs)}.log", "wb")
        proc = subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=self.base, start_new_session=True
        )
        self.procs.append(proc)
        return proc

    def token(self, user: str, role: str) -> str:
        out = subprocess.run(
            [*cuectl(), "--db", str(self.db), "admin", "token", "create", user, "--role", role, "--json"],
            env=self.env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        return json.loads(out)["secret"]

    def submit(self, token: str, spec: dict) -> int:
        req = urllib.request.Request(
            self.url + "/api/v1/jobs",
            data=json.dumps(spec).encode(),
            method="POST",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            return int(json.loads(resp.read())["id"])

    def fake(self, host: str, devices: list[dict]) -> tuple[Path, Path]:
        state = self.base / f"state-{host}"
        state.mkdir()
        path = self.base / f"{host}.yaml"
        path.write_text(yaml.safe_dump({"host": host, "state_dir": str(state), "devices": devices}))
        return path, state

    def worker(self, fake: Path, *extra: str) -> subprocess.Popen:
        return self.spawn(
            [
                *cuectl(),
                "--db",
                str(self.db),
                "worker",
                "--poll",
                "0.2",
                "--sample-interval",
                "0.5",
                "--lease-timeout",
                "8",
                "--cores",
                "2",
                "--run-as-worker-user",
                "-q",
                *extra,
            ],
            dict(self.env, CUECTL_FAKE_GPUS=str(fake)),
        )

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()


def vary(state: Path, devices: int, stop: threading.Event) -> None:
    """Busy cards whose utilisation and memory move, as a renderer's do."""
    t0 = time.monotonic()
    while not stop.wait(0.3):
        t = time.monotonic() - t0
        for i in range(devices):
            util = 62 + 30 * math.sin(t / 2.5 + i) + 6 * math.sin(t * 1.7)
            mem = (14 + 5 * math.sin(t / 4 + i)) * GIB
            tmp = state / f"{i}.json.tmp"
            tmp.write_text(json.dumps({"utilization_pct": max(0, min(100, util)), "memory_used_bytes": int(mem)}))
            tmp.replace(state / f"{i}.json")


RENDER = (
    'for t in $(seq 1 120); do echo "frame #IFRAME#: tile $t/120 rendered in 0.$((t % 7 + 2))s '
    '(samples 1024, denoise on)"; sleep 0.25; done; echo "frame #IFRAME#: written shot020_fx.#IFRAME#.exr"'
)
QUICK = 'echo "comp frame #IFRAME#"; sleep 0.3'


def login(page, farm: Farm, token: str) -> None:
    page.goto(farm.url + "/#/login")
    page.fill("#token", token)
    page.click("#login-submit")
    page.wait_for_selector("#whoami:not(:empty)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "screenshots")
    args = ap.parse_args()
    from playwright.sync_api import expect, sync_playwright

    if not os.access(CHROMIUM, os.X_OK):
        print(f"error: no Chromium at {CHROMIUM} (apt-get install chromium, or set CUECTL_CHROMIUM)", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="cuectl-screenshots-"))
    stop = threading.Event()
    farm = Farm(base)
    try:
        ada, alice, vera = farm.token("ada", "admin"), farm.token("alice", "user"), farm.token("vera", "viewer")
        rtx = {"model": "NVIDIA RTX 6000 Ada Generation", "vendor": "NVIDIA", "memory": "48GiB"}
        a100 = {"model": "NVIDIA A100-SXM4-80GB", "vendor": "NVIDIA", "memory": "80GiB"}
        fake_a100, _ = farm.fake("gpu-a100-01", [a100] * 4)
        farm.worker(fake_a100, "--until-idle", "--gpu-only").wait(60)  # registers the host, runs nothing
        fake_rtx, state = farm.fake("render-01", [rtx, rtx])
        threading.Thread(target=vary, args=(state, 2, stop), daemon=True).start()

        comp = farm.submit(
            ada,
            {
                "name": "shot010 comp",
                "priority": 40,
                "layers": [{"name": "comp", "command": ["sh", "-c", QUICK], "range": "1-24", "chunk": 2}],
            },
        )
        farm.submit(
            alice,
            {
                "name": "lookdev turntable",
                "layers": [
                    {
                        "name": "main",
                        "command": ["sh", "-c", "echo missing texture >&2; exit 3"],
                        "range": "1-2",
                        "retries": 0,
                    }
                ],
            },
        )
        fx = farm.submit(
            alice,
            {
                "name": "shot020 fx",
                "priority": 60,
                "layers": [
                    {"name": "sim", "command": ["sh", "-c", QUICK], "range": "1-4"},
                    {
                        "name": "render",
                        "command": ["sh", "-c", RENDER],
                        "range": "1001-1040",
                        "gpus": 1,
                        "gpu_vendor": "NVIDIA",
                        "gpu_models": ["RTX 6000 Ada", "A100"],
                        "gpu_memory_min": "24G",
                        "depends": "sim",
                    },
                ],
            },
        )
        farm.submit(
            ada,
            {
                "name": "train sweep",
                "layers": [
                    {
                        "name": "train",
                        "command": ["python3", "train.py", "--seed", "#IFRAME#"],
                        "range": "1-16",
                        "gpus": 2,
                        "gpu_models": "H100",
                    }
                ],
            },
        )
        farm.worker(fake_rtx)
        time.sleep(14)  # comp finishes, the render frames run a while: a chart worth showing

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])

            def page_for(token: str | None, **options):
                options.setdefault("viewport", {"width": 1280, "height": 800})
                context = browser.new_context(device_scale_factor=1, **options)
                page = context.new_page()
                if token:
                    login(page, farm, token)
                return page

            def shot(page, name: str) -> None:
                page.wait_for_timeout(400)  # a live tick and the chart's redraw
                page.screenshot(path=str(args.out / name))
                print(f"{args.out / name}: {(args.out / name).stat().st_size // 1024} KiB")

            page = page_for(None)
            page.goto(farm.url + "/")
            page.wait_for_selector("#token")
            shot(page, "login.png")

            page = page_for(ada)
            expect(page.locator(f'#jobs-table tr[data-job-id="{comp}"] .state')).to_have_text(
                "SUCCEEDED", timeout=30_000
            )
            priority = page.locator('#jobs-table th button.sort:text-is("Priority")')
            priority.click()
            priority.click()  # highest first
            for job in (fx, comp):
                page.check(f'#jobs-table tr[data-job-id="{job}"] input.select-row')
            shot(page, "jobs.png")

            page.goto(f"{farm.url}/#/jobs/{fx}")
            running = (
                page.locator("#frames-table tr[data-frame-id]")
                .filter(has=page.locator(".state", has_text="RUNNING"))
                .first
            )
            running.wait_for(timeout=30_000)
            running.locator('button[data-action="log"]').click()
            page.wait_for_selector("pre#log-view:not(:empty)")
            page.wait_for_timeout(2500)
            shot(page, "job.png")

            page.goto(farm.url + "/#/hosts")
            page.wait_for_selector('#hosts-table tr[data-host="render-01"]')
            shot(page, "hosts.png")

            page.goto(farm.url + "/#/hosts/render-01")
            page.wait_for_selector("#host-frames tr[data-frame-id]")
            shot(page, "host.png")

            page.goto(farm.url + "/#/submit")
            form = page.locator("form#submit-form")
            form.locator('[name="name"]').fill("shot030 lighting")
            form.locator('[name="command"]').fill("blender -b shot030.blend -f #IFRAME#")
            form.locator('[name="range"]').fill("1-240")
            form.locator('[name="gpus"]').fill("-1")
            form.locator('[name="gpu_memory_min"]').fill("24G")
            page.click("#submit-job")
            page.wait_for_selector('.field-error[data-for="gpus"]:not(:empty)')
            shot(page, "submit-error.png")

            page = page_for(vera)
            page.goto(f"{farm.url}/#/jobs/{fx}")
            page.wait_for_selector("#frames-table tr[data-frame-id]")
            shot(page, "viewer.png")

            page = page_for(
                ada, viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True, color_scheme="dark"
            )
            page.wait_for_selector("#jobs-table tr[data-job-id]")
            shot(page, "phone-jobs-dark.png")
            browser.close()
    finally:
        stop.set()
        farm.stop()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
