"""The hosts page: two hosts registered by real workers from two fake-GPU files with
different models (each worker runs --until-idle: it registers and leaves), a host without
GPUs, and a device held by a RUNNING frame; the vendor, model and memory filters."""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlsplit

import pytest
from webfarm import GIB, RequestLog, expect, login

A100 = {"model": "NVIDIA A100-SXM4-80GB", "vendor": "NVIDIA", "memory": "80GiB"}
MI100 = {"model": "AMD Instinct MI100", "vendor": "AMD", "memory": "32GiB"}


@pytest.fixture(scope="module")
def hosts(farm):
    ada = farm.token("ada", "admin")
    workers = [
        farm.start_worker(
            farm.fake_gpus("gpu-a100", [A100, A100], live={0: {"utilization_pct": 37, "memory_used_bytes": 12 * GIB}}),
            "--until-idle",
        ),
        farm.start_worker(farm.fake_gpus("gpu-mi100", [MI100]), "--until-idle"),
    ]
    for w in workers:
        assert w.wait(60) == 0, farm.output()
    farm.register_host("cpu-only", [])
    inventory = {h["name"]: h for h in farm.api("GET", "/hosts", token=ada)["hosts"]}
    assert set(inventory) == {"gpu-a100", "gpu-mi100", "cpu-only"}, inventory
    # A frame holding the first A100, as its worker would have claimed it.
    job = farm.submit(ada, "web holder", {"name": "main", "command": ["true"], "gpus": 1, "gpu_models": "A100"})
    a100 = inventory["gpu-a100"]["devices"]
    farm.claim(job["layers"][0]["id"], host="gpu-a100", gpu_uuids=(a100[0]["uuid"],))
    return {"token": ada, "inventory": inventory, "a100": a100, "mi100": inventory["gpu-mi100"]["devices"]}


def shown(page) -> list[tuple[str, str]]:
    """(host, device uuid) of every row of the hosts table."""
    return [
        tuple(r)
        for r in page.locator("#hosts-table tr[data-host]").evaluate_all(
            "rows => rows.map(r => [r.dataset.host, r.dataset.gpuUuid])"
        )
    ]


def expect_rows(page, wanted: set[tuple[str, str]]) -> None:
    page.wait_for_function(
        """wanted => { const got = [...document.querySelectorAll('#hosts-table tr[data-host]')]
                         .map(r => r.dataset.host + '|' + r.dataset.gpuUuid).sort();
                       return JSON.stringify(got) === JSON.stringify(wanted); }""",
        arg=sorted(f"{h}|{u}" for h, u in wanted),
    )


def test_every_device_of_every_host_with_its_holder(farm, page, hosts):
    login(page, farm, hosts["token"])
    page.click('nav a[href="#/hosts"]')
    a100, mi100 = hosts["a100"], hosts["mi100"]
    expect_rows(page, {("gpu-a100", d["uuid"]) for d in a100} | {("gpu-mi100", mi100[0]["uuid"]), ("cpu-only", "")})
    first = page.locator(f'#hosts-table tr[data-gpu-uuid="{a100[0]["uuid"]}"]')
    expect(first.locator(".host")).to_have_text("gpu-a100")
    expect(first.locator(".index")).to_have_text("0")
    expect(first.locator(".model")).to_have_text("NVIDIA A100-SXM4-80GB")
    expect(first.locator(".mem")).to_contain_text("/")
    assert re.search(r"\b(80|85\.9)\b", first.locator(".mem").inner_text()), first.locator(".mem").inner_text()
    expect(first.locator(".holder")).to_contain_text("web holder")
    expect(page.locator(f'#hosts-table tr[data-gpu-uuid="{a100[1]["uuid"]}"] .holder')).to_have_text("-")
    expect(page.locator(f'#hosts-table tr[data-gpu-uuid="{mi100[0]["uuid"]}"] .model')).to_have_text(
        "AMD Instinct MI100"
    )


def test_filters_by_model_memory_and_vendor(farm, page, hosts):
    login(page, farm, hosts["token"])
    page.click('nav a[href="#/hosts"]')
    a100, mi100 = hosts["a100"], hosts["mi100"]
    everything = {("gpu-a100", d["uuid"]) for d in a100} | {("gpu-mi100", mi100[0]["uuid"]), ("cpu-only", "")}
    expect_rows(page, everything)
    log = RequestLog(page)

    page.fill("#filter-model", "MI100")
    expect_rows(page, {("gpu-mi100", mi100[0]["uuid"])})
    page.fill("#filter-model", "")
    expect_rows(page, everything)

    page.fill("#filter-memory", "64G")
    expect_rows(page, {("gpu-a100", d["uuid"]) for d in a100})
    page.fill("#filter-memory", "")
    expect_rows(page, everything)

    page.select_option("#filter-vendor", "AMD")
    expect_rows(page, {("gpu-mi100", mi100[0]["uuid"])})
    page.fill("#filter-model", "A100")  # AMD and A100: nothing
    expect_rows(page, set())
    page.select_option("#filter-vendor", "any")
    expect_rows(page, {("gpu-a100", d["uuid"]) for d in a100})

    asked = [parse_qs(urlsplit(r.url).query) for r in log.stop() if urlsplit(r.url).path == "/api/v1/hosts"]
    assert {"model": ["MI100"]} in asked or any(q.get("model") == ["MI100"] for q in asked), asked
    assert any(q.get("gpu_memory_min") == ["64G"] for q in asked), asked
    assert any(q.get("vendor") == ["AMD"] for q in asked), asked
