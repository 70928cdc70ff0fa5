"""What CueWeb users expect of the tables (issue 41 §6): columns that sort, rows selected
for bulk pause/resume/retry/kill/eat under the API's owner and admin rules, a frame's GPU
named as "host gpu N (model)", a host page with lock/unlock for admins, column widths that
hold still while rows change, and a bad filter explained beside its field with the table
emptied.

The hosts here are registered, and their frames claimed, from this process (webfarm.py): a
test decides exactly what the store holds. No worker runs in this module, so no frame
starts or ends on its own."""

from __future__ import annotations

import pytest
from webfarm import GIB, expect, login, wait_for

A100 = {
    "vendor": "NVIDIA",
    "model": "NVIDIA A100-SXM4-80GB",
    "memory_total_bytes": 80 * GIB,
    "memory_free_bytes": 80 * GIB,
}


def device(host: str, index: int, model: dict = A100) -> dict:
    return {**model, "index": index, "uuid": f"GPU-{host}-{index}"}


@pytest.fixture(scope="module")
def farmstate(farm):
    ada, alice, bob = farm.token("ada", "admin"), farm.token("alice", "user"), farm.token("bob", "user")
    farm.register_host("tbl-node", [device("tbl-node", 0), device("tbl-node", 1)])
    # A job whose frames run on gpu 1 of tbl-node (as a worker there would hold it).
    render = farm.submit(alice, "tbl render", {"name": "main", "command": ["true"], "range": "1-6", "gpus": 1})
    claimed = farm.claim(render["layers"][0]["id"], host="tbl-node", gpu_uuids=("GPU-tbl-node-1",))
    farm.live("tbl-node", claimed, 42, 5 * GIB)
    layer = {"name": "main", "command": ["true"], "range": "1-2"}
    jobs = {
        "a1": farm.submit(alice, "tbl alpha", layer, priority=30),
        "a2": farm.submit(alice, "tbl charlie", layer, priority=10),
        "b1": farm.submit(bob, "tbl bravo", layer, priority=20),
    }
    return {"ada": ada, "alice": alice, "bob": bob, "render": render, "claimed": claimed, "jobs": jobs}


def job_ids_shown(page) -> list[int]:
    return [
        int(i)
        for i in page.locator("#jobs-table tr[data-job-id]").evaluate_all("rows => rows.map(r => r.dataset.jobId)")
    ]


def header_widths(page, table: str) -> list[float]:
    return page.locator(f"#{table} thead th").evaluate_all("ths => ths.map(th => th.getBoundingClientRect().width)")


def test_job_columns_sort_both_ways_and_back(farm, page, farmstate):
    jobs = farmstate["jobs"]
    ours = {jobs[k]["id"] for k in jobs}
    login(page, farm, farmstate["ada"])
    page.fill("#jobs-filter", "tbl ")  # only this test's three jobs (and the render job)
    expect(page.locator("#jobs-table tr[data-job-id]")).to_have_count(4)
    # A job with a frame running reads RUNNING, as in `cuectl job list` (its JSON state stays PENDING).
    expect(page.locator(f'#jobs-table tr[data-job-id="{farmstate["render"]["id"]}"] .state')).to_have_text("RUNNING")

    def ours_in_order() -> list[int]:
        return [i for i in job_ids_shown(page) if i in ours]

    name = page.locator('#jobs-table th button.sort:text-is("Name")')
    name.click()
    expect(page.locator("#jobs-table th.name")).to_have_attribute("aria-sort", "ascending")
    assert ours_in_order() == [jobs["a1"]["id"], jobs["b1"]["id"], jobs["a2"]["id"]]  # alpha, bravo, charlie
    name.click()
    expect(page.locator("#jobs-table th.name")).to_have_attribute("aria-sort", "descending")
    assert ours_in_order() == [jobs["a2"]["id"], jobs["b1"]["id"], jobs["a1"]["id"]]

    page.locator('#jobs-table th button.sort:text-is("Priority")').click()
    expect(page.locator("#jobs-table th.name")).to_have_attribute("aria-sort", "none")
    assert ours_in_order() == [jobs["a2"]["id"], jobs["b1"]["id"], jobs["a1"]["id"]]  # 10, 20, 30
    # The order holds across live refreshes (a second of ticks).
    page.wait_for_timeout(1500)
    assert ours_in_order() == [jobs["a2"]["id"], jobs["b1"]["id"], jobs["a1"]["id"]]
    page.locator('#jobs-table th button.sort:text-is("Priority")').click()
    page.locator('#jobs-table th button.sort:text-is("Priority")').click()  # third press: the server's order
    expect(page.locator("#jobs-table th.priority")).to_have_attribute("aria-sort", "none")
    assert ours_in_order() == sorted(ours, reverse=True)  # newest first, as the API pages them


def test_a_user_selects_own_jobs_only_and_pauses_then_kills_them_together(farm, page, farmstate):
    alice, jobs = farmstate["alice"], farmstate["jobs"]
    login(page, farm, alice)
    page.fill("#jobs-filter", "tbl ")
    row = lambda key: page.locator(f'#jobs-table tr[data-job-id="{jobs[key]["id"]}"]')  # noqa: E731
    expect(row("a1").locator("input.select-row")).to_be_visible()
    expect(row("b1").locator("input.select-row")).to_be_hidden()  # bob's: not hers to change
    expect(page.locator("#jobs-bulk")).to_be_hidden()

    page.check("#jobs-select-all")  # every job shown that she may change: not bob's
    expect(page.locator("#jobs-bulk .selected-count")).to_have_text("3 jobs selected")  # a1, a2, render
    page.uncheck(f'#jobs-table tr[data-job-id="{farmstate["render"]["id"]}"] input.select-row')
    expect(page.locator("#jobs-bulk .selected-count")).to_have_text("2 jobs selected")
    expect(page.locator("#jobs-select-all")).to_have_js_property("indeterminate", True)

    page.click('#jobs-bulk button[data-bulk="pause"]')
    wait_for(
        lambda: all(farm.api("GET", f"/jobs/{jobs[k]['id']}", token=alice)["paused"] for k in ("a1", "a2")),
        timeout=15,
        what="both selected jobs paused",
    )
    assert not farm.api("GET", f"/jobs/{jobs['b1']['id']}", token=alice)["paused"]
    assert not farm.api("GET", f"/jobs/{farmstate['render']['id']}", token=alice)["paused"]
    expect(page.locator('#jobs-bulk button[data-bulk="resume"]')).to_be_enabled()

    page.click('#jobs-bulk button[data-bulk="kill"]')
    dialog = page.locator("dialog#confirm")
    expect(dialog).to_contain_text("tbl alpha")
    expect(dialog).to_contain_text("tbl charlie")
    page.click("#confirm-ok")
    wait_for(
        lambda: all(
            farm.api("GET", f"/jobs/{jobs[k]['id']}", token=alice)["outcome"] == "KILLED" for k in ("a1", "a2")
        ),
        timeout=15,
        what="both selected jobs killed",
    )
    assert farm.api("GET", f"/jobs/{jobs['b1']['id']}", token=alice)["state"] != "FINISHED"
    expect(row("a1").locator(".state")).to_have_text("KILLED")
    # Still selected, but finished: nothing left to kill (the server would answer 409).
    expect(page.locator("#jobs-bulk .selected-count")).to_have_text("2 jobs selected")
    expect(page.locator('#jobs-bulk button[data-bulk="kill"]')).to_be_disabled()


def test_frames_are_selected_and_eaten_or_killed_together_and_sort(farm, page, farmstate):
    ada = farmstate["ada"]
    job = farm.submit(ada, "tbl frames", {"name": "main", "command": ["true"], "range": "1-5"})
    ids = [f["id"] for f in farm.frames(job["id"], ada)]
    login(page, farm, ada)
    page.goto(f"{farm.url}/#/jobs/{job['id']}")
    rows = page.locator("#frames-table tr[data-frame-id]")
    expect(rows).to_have_count(5)
    for frame_id in ids[:2]:
        page.check(f'#frames-table tr[data-frame-id="{frame_id}"] input.select-row')
    expect(page.locator("#frames-bulk .selected-count")).to_have_text("2 frames selected")
    page.click('#frames-bulk button[data-bulk="eat"]')
    expect(page.locator("dialog#confirm")).to_contain_text("0001-main")
    page.click("#confirm-ok")
    for frame_id in ids[:2]:
        expect(page.locator(f'#frames-table tr[data-frame-id="{frame_id}"] .state')).to_have_text("EATEN")
    assert [f["state"] for f in farm.frames(job["id"], ada)] == ["EATEN", "EATEN", "WAITING", "WAITING", "WAITING"]

    # All of them, then Kill: the eaten two have nothing to kill and are left alone.
    page.check("#frames-select-all")
    expect(page.locator("#frames-bulk .selected-count")).to_have_text("5 frames selected")
    page.click('#frames-bulk button[data-bulk="kill"]')
    expect(page.locator("dialog#confirm")).to_contain_text("2 selected frames are left alone")
    page.click("#confirm-ok")
    expect(page.locator(f'#frames-table tr[data-frame-id="{ids[4]}"] .state')).to_have_text("DEAD")
    assert [f["state"] for f in farm.frames(job["id"], ada)] == ["EATEN", "EATEN", "DEAD", "DEAD", "DEAD"]

    # Sorting by state puts the states in their usual order (DEAD before EATEN), and back.
    page.locator('#frames-table th button.sort:text-is("State")').click()
    expect(rows.first).to_have_attribute("data-frame-id", str(ids[2]))
    page.locator('#frames-table th button.sort:text-is("Frame")').click()
    page.locator('#frames-table th button.sort:text-is("Frame")').click()  # descending
    expect(rows.first).to_have_attribute("data-frame-id", str(ids[4]))


def test_a_frame_names_its_gpu_as_host_index_and_model(farm, page, farmstate):
    login(page, farm, farmstate["alice"])
    page.goto(f"{farm.url}/#/jobs/{farmstate['render']['id']}")
    running = page.locator(f'#frames-table tr[data-frame-id="{farmstate["claimed"].frame_id}"]')
    expect(running.locator(".host")).to_have_text("tbl-node")
    expect(running.locator(".gpu")).to_have_text("gpu 1 (A100-SXM4-80GB)")  # beside its host
    expect(running.locator(".gpu")).to_have_attribute("title", "tbl-node gpu 1 (NVIDIA A100-SXM4-80GB) GPU-tbl-node-1")
    running.locator('button[data-action="log"]').click()
    facts = page.locator("#frame-panel .facts")
    expect(facts).to_contain_text("tbl-node gpu 1 (A100-SXM4-80GB)")
    assert "GPU-tbl-node-1" not in facts.inner_text()


def test_the_host_page_shows_devices_holders_and_frames_and_admins_lock_it(farm, page, farmstate):
    login(page, farm, farmstate["ada"])
    page.click('nav a[href="#/hosts"]')
    page.locator('#hosts-table tr[data-host="tbl-node"] .host a').first.click()
    page.wait_for_url("**/#/hosts/tbl-node")
    expect(page.locator("#host-title")).to_have_text("tbl-node")
    held = page.locator('#host-gpus tr[data-gpu-uuid="GPU-tbl-node-1"]')
    expect(held.locator(".holder")).to_contain_text("tbl render")
    expect(page.locator('#host-gpus tr[data-gpu-uuid="GPU-tbl-node-0"] .holder')).to_have_text("-")
    frame = page.locator(f'#host-frames tr[data-frame-id="{farmstate["claimed"].frame_id}"]')
    expect(frame.locator(".job")).to_have_text("tbl render")
    expect(frame.locator(".gpu")).to_have_text("gpu 1 (A100-SXM4-80GB)")
    expect(frame.locator(".gpu-util")).to_have_text("42")

    page.click('#host-actions button[data-action="lock"]')
    expect(page.locator("dialog#confirm")).to_contain_text("Lock host tbl-node")
    page.click("#confirm-ok")
    expect(page.locator("#host-state")).to_contain_text("locked")
    assert farm.api("GET", "/hosts/tbl-node", token=farmstate["ada"])["locked"] is True
    expect(page.locator('#host-actions button[data-action="lock"]')).to_be_hidden()
    page.click('#host-actions button[data-action="unlock"]')
    page.click("#confirm-ok")
    expect(page.locator("#host-state")).not_to_contain_text("locked")
    assert farm.api("GET", "/hosts/tbl-node", token=farmstate["ada"])["locked"] is False

    # Frame's job link leads to the job.
    frame.locator(".job a").click()
    page.wait_for_url(f"**/#/jobs/{farmstate['render']['id']}")


def test_only_an_admin_may_lock_a_host(farm, page, farmstate):
    alice = farmstate["alice"]
    login(page, farm, alice)
    page.goto(f"{farm.url}/#/hosts/tbl-node")
    expect(page.locator('#host-gpus tr[data-gpu-uuid="GPU-tbl-node-0"]')).to_be_visible()
    expect(page.locator("#host-actions button")).to_have_count(0)
    refused = farm.api("POST", "/hosts/tbl-node/lock", token=alice, status=403)
    assert "admin" in refused["detail"], refused
    assert farm.api("GET", "/hosts/tbl-node", token=alice)["locked"] is False
    farm.api("POST", "/hosts/tbl-node/reboot", token=farmstate["ada"], status=404)
    farm.api("POST", "/hosts/no-such-host/lock", token=farmstate["ada"], status=404)
    farm.api("GET", "/hosts/no-such-host", token=alice, status=404)


def test_column_widths_hold_still_while_rows_change(farm, page, farmstate):
    ada = farmstate["ada"]
    login(page, farm, ada)
    page.fill("#jobs-filter", "tbl ")
    expect(page.locator("#jobs-table tr[data-job-id]").first).to_be_visible()
    before = header_widths(page, "jobs-table")
    # A job with a very long name and user appears in the filtered table on the next tick.
    long = farm.submit(ada, "tbl " + "very-long-shot-name-" * 6, {"name": "main", "command": ["true"]})
    expect(page.locator(f'#jobs-table tr[data-job-id="{long["id"]}"]')).to_be_visible()
    assert header_widths(page, "jobs-table") == before
    long_name = page.locator(f'#jobs-table tr[data-job-id="{long["id"]}"] td.name')
    assert long_name.evaluate("td => td.scrollWidth > td.clientWidth"), "the long name should be cut with …"

    # Hosts: a device gets a holder with a long label and live values, between two ticks.
    page.click('nav a[href="#/hosts"]')
    expect(page.locator('#hosts-table tr[data-gpu-uuid="GPU-tbl-node-0"]')).to_be_visible()
    before = header_widths(page, "hosts-table")
    job = farm.submit(
        ada, "tbl holder with a long name " + "x" * 50, {"name": "a-long-layer-name", "command": ["true"], "gpus": 1}
    )
    claimed = farm.claim(job["layers"][0]["id"], host="tbl-node", gpu_uuids=("GPU-tbl-node-0",))
    farm.live("tbl-node", claimed, 99, 79 * GIB)
    expect(page.locator('#hosts-table tr[data-gpu-uuid="GPU-tbl-node-0"] .holder')).to_contain_text("tbl holder")
    assert header_widths(page, "hosts-table") == before

    # Frames: rows go from WAITING with no host to RUNNING on a long host name.
    frames_job = farm.submit(ada, "tbl widths", {"name": "main", "command": ["true"], "range": "1-3", "gpus": 1})
    page.goto(f"{farm.url}/#/jobs/{frames_job['id']}")
    expect(page.locator("#frames-table tr[data-frame-id]")).to_have_count(3)
    before = header_widths(page, "frames-table")
    host = "a-render-node-with-a-very-long-hostname-" + "y" * 30
    farm.register_host(host, [device(host, 0)])
    farm.claim(frames_job["layers"][0]["id"], host=host, gpu_uuids=(f"GPU-{host}-0",))
    expect(page.locator("#frames-table td.state").first).to_have_text("RUNNING")
    expect(page.locator("#frames-table td.host").first).to_have_text(host)
    assert header_widths(page, "frames-table") == before


@pytest.mark.error_banner_ok
def test_a_bad_filter_is_shown_beside_its_field_and_empties_the_table(farm, page, farmstate):
    login(page, farm, farmstate["ada"])
    page.click('nav a[href="#/hosts"]')
    rows = page.locator("#hosts-table tr[data-host]")
    expect(rows.first).to_be_visible()
    page.fill("#filter-memory", "24X")
    error = page.locator("#filter-memory-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("gpu_memory_min")
    expect(page.locator("#filter-memory")).to_have_attribute("aria-invalid", "true")
    expect(rows).to_have_count(0)  # not the last filter's rows
    expect(page.locator("#error-banner")).to_be_hidden()  # the message is beside the field instead
    page.fill("#filter-memory", "64G")
    expect(page.locator('#hosts-table tr[data-gpu-uuid="GPU-tbl-node-0"]')).to_be_visible()
    expect(error).to_be_hidden()
    expect(page.locator("#filter-memory")).not_to_have_attribute("aria-invalid", "true")


def test_host_rows_sort_by_host_and_gpu(farm, page, farmstate):
    farm.register_host("tbl-cpu", [])  # no GPU: its one row's index is "-"
    login(page, farm, farmstate["ada"])
    page.click('nav a[href="#/hosts"]')
    expect(page.locator('#hosts-table tr[data-gpu-uuid="GPU-tbl-node-1"]')).to_be_visible()

    def shown() -> list[tuple[str, str]]:
        return [
            tuple(r)
            for r in page.locator("#hosts-table tr[data-host]").evaluate_all(
                "rows => rows.map(r => [r.dataset.host, r.querySelector('.index').textContent])"
            )
        ]

    gpu = page.locator('#hosts-table th button.sort:text-is("GPU")')
    gpu.click()
    gpu.click()  # descending: every host's gpu 1 before any gpu 0, the GPU-less host ("-") last
    expect(page.locator("#hosts-table th.index")).to_have_attribute("aria-sort", "descending")
    expect(page.locator('#hosts-table tr[data-host="tbl-cpu"]')).to_be_visible()
    indexes = [i for _, i in shown()]
    assert "-" in indexes and "1" in indexes, indexes
    numbers = [int(i) for i in indexes if i != "-"]
    assert numbers == sorted(numbers, reverse=True) and indexes[len(numbers) :] == ["-"] * (
        len(indexes) - len(numbers)
    ), indexes
    page.locator('#hosts-table th button.sort:text-is("Host")').click()
    expect(page.locator("#hosts-table th.host")).to_have_attribute("aria-sort", "ascending")
    hosts = [h for h, _ in shown()]
    assert hosts == sorted(hosts, key=str.lower), hosts
