"""A device's live value that is too old to be current (issue 41 §2): the hosts page and a
host's page show how old the last sample is instead of a number, and the number again
once the worker samples. The worker is stopped with SIGSTOP, as a hung worker would be: its
last published sample then ages in the store while the page keeps polling."""

from __future__ import annotations

import os
import signal

from webfarm import GIB, expect, login

A100 = {"model": "NVIDIA A100-SXM4-80GB", "vendor": "NVIDIA", "memory": "80GiB"}


def test_a_stale_sample_reads_as_its_age_then_fresh_again(farm, page):
    ada = farm.token("ada", "admin")
    worker = farm.start_worker(
        farm.fake_gpus("gpu-stale", [A100], live={0: {"utilization_pct": 37, "memory_used_bytes": 12 * GIB}})
    )
    login(page, farm, ada)
    page.click('nav a[href="#/hosts"]')
    cell = page.locator('#hosts-table tr[data-host="gpu-stale"] .util')
    expect(cell).to_have_text("37%", timeout=30_000)
    os.kill(worker.pid, signal.SIGSTOP)  # samples every 0.2 s: stale after 0.4 s
    try:
        expect(cell).to_contain_text(" ago", timeout=30_000)
        assert "%" not in cell.inner_text()
        page.goto(page.url.split("#")[0] + "#/hosts/gpu-stale")
        expect(page.locator("tr[data-gpu-uuid] .util").first).to_contain_text(" ago", timeout=30_000)
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    expect(page.locator("tr[data-gpu-uuid] .util").first).to_have_text("37%", timeout=30_000)
