"""A job of 10,000 frames in the job page: state chips, scrolling to the last frame, and what
the live refresh downloads. Three frames are held RUNNING by a "worker" on host ghost-01
played from this process (its live GPU values changed at will), so the test decides exactly
what changes between ticks. How fast it is, is measured by bench/bench_web.py, not here."""

from __future__ import annotations

import time
from urllib.parse import parse_qs, urlsplit

import pytest
from webfarm import GIB, RequestLog, assert_not_reloaded, expect, login, mark_page

FRAMES = 10_000


@pytest.fixture(scope="module")
def big(farm):
    ada = farm.token("ada", "admin")
    job = farm.submit(ada, "web big", {"name": "main", "command": ["true"], "range": f"1-{FRAMES}", "gpus": 1})
    layer_id = job["layers"][0]["id"]
    claims = [farm.claim(layer_id, host="ghost-01", gpu_uuids=(f"GPU-ghost-{i}",)) for i in range(3)]
    for c in claims:
        farm.live("ghost-01", c, 20, 2 * GIB)
    frames = farm.frames(job["id"], ada)
    assert len(frames) == FRAMES
    return {"job": job, "claims": claims, "frames": frames, "token": ada}


# ``scroller(table)``: the table's scrolling box (its own, or the page's), for page functions.
SCROLLER = """const scroller = t => { let el = t.parentElement;
    while (el && el !== document.body && !/(auto|scroll)/.test(getComputedStyle(el).overflowY)) el = el.parentElement;
    return (el && el !== document.body) ? el : document.scrollingElement; };"""


def rows(page):
    return page.locator("#frames-table tr[data-frame-id]")


def row(page, frame_id):
    return page.locator(f'#frames-table tr[data-frame-id="{frame_id}"]')


def open_job(farm, page, big):
    login(page, farm, big["token"])
    page.goto(f"{farm.url}/#/jobs/{big['job']['id']}")
    expect(row(page, big["claims"][0].frame_id).locator(".state")).to_have_text("RUNNING")


def scroll_to(page, frame_id, *, then_top: bool = False) -> None:
    """Scroll the frames table to its end until ``frame_id``'s row is there (the page loads a
    big job's list in parts: the end moves until the last part is in); ``then_top``: back to
    the first row afterwards."""
    try:
        page.wait_for_function(
            "id => {"
            + SCROLLER
            + """
            const s = scroller(document.getElementById('frames-table'));
            s.scrollTop = s.scrollHeight;
            return !!document.querySelector(`#frames-table tr[data-frame-id="${id}"]`); }""",
            arg=frame_id,
            polling=250,
        )
    except Exception:
        where = page.locator("#frames-table").evaluate(
            "t => {"
            + SCROLLER
            + """
            const s = scroller(t), ids = [...t.querySelectorAll('tr[data-frame-id]')].map(r => r.dataset.frameId);
            return {scroller: s.tagName + '.' + s.className, scrollTop: s.scrollTop, scrollHeight: s.scrollHeight,
                    clientHeight: s.clientHeight, rows: ids.length, first: ids[0], last: ids[ids.length - 1]}; }"""
        )
        raise AssertionError(f"frame {frame_id} never shown by scrolling the table to its end: {where}") from None
    if then_top:
        page.locator("#frames-table").evaluate("t => {" + SCROLLER + " scroller(t).scrollTop = 0; }")


def frames_requests(requests, job_id):
    out = []
    for r in requests:
        url = urlsplit(r.url)
        if url.path == f"/api/v1/jobs/{job_id}/frames":
            out.append(parse_qs(url.query))
    return out


def test_ten_thousand_frames_filter_by_state_and_scroll_to_the_last(farm, page, big):
    open_job(farm, page, big)
    mark_page(page)
    chip = page.locator('#state-chips .chip[data-state="RUNNING"]')
    expect(chip).to_have_attribute("aria-pressed", "false")
    chip.click()
    expect(chip).to_have_attribute("aria-pressed", "true")
    expect(rows(page)).to_have_count(3)
    assert rows(page).locator(".state").all_inner_texts() == ["RUNNING"] * 3
    chip.click()
    expect(chip).to_have_attribute("aria-pressed", "false")
    expect(row(page, big["frames"][3]["id"])).to_be_visible()  # WAITING rows are back

    waiting = page.locator('#state-chips .chip[data-state="WAITING"]')
    waiting.click()
    expect(row(page, big["claims"][0].frame_id)).to_have_count(0)
    states = set(rows(page).locator(".state").all_inner_texts())
    assert states == {"WAITING"}, states
    waiting.click()
    expect(row(page, big["claims"][0].frame_id)).to_be_visible()

    # The last of 10,000 rows is reachable by scrolling the table to its end (virtual rows or
    # not), as a person would: again while the rest of the list is still arriving.
    last = big["frames"][-1]
    scroll_to(page, last["id"])
    expect(row(page, last["id"])).to_be_visible()
    expect(row(page, last["id"]).locator(".frame")).to_contain_text(str(FRAMES))
    assert_not_reloaded(page)


def test_a_live_tick_fetches_the_running_frames_not_the_whole_list(farm, page, big):
    job_id, claims = big["job"]["id"], big["claims"]
    open_job(farm, page, big)
    mark_page(page)
    scroll_to(page, big["frames"][-1]["id"], then_top=True)  # the first load is over: only ticks from here
    expect(row(page, claims[0].frame_id).locator(".gpu-util")).to_contain_text("20")

    # Only the RUNNING frames change (their live values): about 3 s of ticks.
    log = RequestLog(page)
    start = time.monotonic()
    for c in claims:
        farm.live("ghost-01", c, 81, 3 * GIB)
    expect(row(page, claims[0].frame_id).locator(".gpu-util")).to_contain_text("81")
    # (Waiting in the page, not time.sleep: Playwright delivers the request events meanwhile.)
    page.wait_for_timeout(max(0.0, 3.5 - (time.monotonic() - start)) * 1000)
    seen = frames_requests(log.stop(), job_id)
    full = [q for q in seen if "state" not in q and "ids" not in q]
    assert not full, f"a tick fetched the whole frame list again: {full}"
    running = [q for q in seen if q.get("state") == ["RUNNING"]]
    assert len(running) >= 2, f"expected a RUNNING-frames fetch each tick, saw {seen}"
    assert all(q.get("attempts") == ["false"] for q in seen), seen

    # A RUNNING frame ends: the next tick fetches that frame by id, still not the list.
    log = RequestLog(page)
    farm.complete(claims[2])
    expect(row(page, claims[2].frame_id).locator(".state")).to_have_text("SUCCEEDED")
    seen = frames_requests(log.stop(), job_id)
    assert any(str(claims[2].frame_id) in q.get("ids", [""])[0].split(",") for q in seen), seen
    assert not [q for q in seen if "state" not in q and "ids" not in q], f"whole list fetched: {seen}"

    # A change the RUNNING frames do not explain (someone else kills a WAITING frame):
    # the page must still show it, whatever it fetches to find out.
    victim = big["frames"][5]["id"]
    farm.api("POST", f"/frames/{victim}/kill", token=big["token"])
    expect(row(page, victim).locator(".state")).to_have_text("DEAD")
    assert_not_reloaded(page)
