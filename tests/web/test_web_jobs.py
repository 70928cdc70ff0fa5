"""Submitting, watching and killing work as a person does in the browser, with a real
`cuectl worker` running the frames on fake GPUs whose live values are non-zero (63 %
busy, 6.5 GiB used: src/cuectl/gpu/fake.py reads them from the state directory)."""

from __future__ import annotations

import re

import pytest
from webfarm import GIB, assert_not_reloaded, expect, login, mark_page

RTX6000 = {"model": "NVIDIA RTX 6000 Ada Generation", "vendor": "NVIDIA", "memory": "48GiB"}
LIVE = {"utilization_pct": 63, "memory_used_bytes": int(6.5 * GIB)}
FORM_COMMAND = "sh -c 'for i in 1 2 3 4 5 6; do echo \"line $i of frame #IFRAME#\"; sleep 0.5; done'"

# The id of the first row of #frames-table whose cells all match (selector -> regular
# expression), looked at in one go inside the page: never a row that changed between reads.
ROW_WHERE = """(checks) => {
  for (const row of document.querySelectorAll('#frames-table tr[data-frame-id]')) {
    if (Object.entries(checks).every(([sel, re]) => {
      const cell = row.querySelector(sel);
      return cell && new RegExp(re).test(cell.textContent.trim());
    })) return row.getAttribute('data-frame-id');
  }
  return null;
}"""


@pytest.fixture(scope="module")
def worker(farm):
    """One worker for the module: host render-01, two 48 GiB NVIDIA cards, 4 CPU slots."""
    fake = farm.fake_gpus("render-01", [RTX6000, RTX6000], live={0: LIVE, 1: LIVE})
    proc = farm.start_worker(fake)
    yield proc
    assert proc.poll() is None, f"the worker died: {farm.output()}"


def job_id_from_url(page) -> int:
    page.wait_for_url(re.compile(r".*#/jobs/\d+$"))
    return int(page.url.rsplit("/", 1)[1])


def rows(page):
    return page.locator("#frames-table tr[data-frame-id]")


def test_a_bad_field_is_shown_beside_its_input(farm, page):
    login(page, farm, farm.token("alice", "user"))
    page.click('nav a[href="#/submit"]')
    form = page.locator("form#submit-form")
    form.locator('[name="name"]').fill("bad gpus")
    form.locator('[name="command"]').fill("true")
    form.locator('[name="gpus"]').fill("-1")
    page.click("#submit-job")
    error = page.locator('.field-error[data-for="gpus"]')
    expect(error).to_be_visible()
    expect(error).to_contain_text("0 or more")  # the API's 422 detail, where the mistake is
    expect(form.locator('[name="gpus"]')).to_have_attribute("aria-invalid", "true")
    assert page.url.endswith("#/submit")

    # Fixed, and another mistake: the message moves to the field now at fault.
    form.locator('[name="gpus"]').fill("1")
    form.locator('[name="range"]').fill("1-x")
    page.click("#submit-job")
    expect(page.locator('.field-error[data-for="range"]')).to_be_visible()
    expect(page.locator('.field-error[data-for="range"]')).not_to_have_text("")
    expect(form.locator('[name="range"]')).to_have_attribute("aria-invalid", "true")
    expect(page.locator('.field-error[data-for="gpus"]')).to_be_hidden()
    expect(form.locator('[name="gpus"]')).not_to_have_attribute("aria-invalid", "true")
    assert page.url.endswith("#/submit")
    assert not any(j["name"] == "bad gpus" for j in farm.api("GET", "/jobs", token=farm.token("alice", "user"))["jobs"])


def test_submit_a_gpu_job_and_watch_it_run_live_without_reloading(farm, worker, page):
    alice = farm.token("alice", "user")
    login(page, farm, alice)
    mark_page(page)
    page.click('nav a[href="#/submit"]')
    form = page.locator("form#submit-form")
    expect(form.locator('[name="layer"]')).to_have_value("main")
    expect(form.locator('[name="range"]')).to_have_value("1")
    form.locator('[name="name"]').fill("web render")
    form.locator('[name="command"]').fill(FORM_COMMAND)
    form.locator('[name="range"]').fill("1-3")
    form.locator('[name="gpus"]').fill("1")
    form.locator('[name="gpu_vendor"]').select_option("NVIDIA")
    form.locator('[name="gpu_models"]').fill("RTX 6000 Ada, A100")
    form.locator('[name="gpu_memory_min"]').fill("16G")
    page.click("#submit-job")
    job_id = job_id_from_url(page)

    # What was submitted is what the form said: the command split like a shell would.
    job = farm.api("GET", f"/jobs/{job_id}", token=alice)
    assert job["name"] == "web render" and job["user"] == "alice"
    (layer,) = job["layers"]
    assert layer["name"] == "main" and layer["range"] == "1-3"
    assert layer["command"] == [
        "sh",
        "-c",
        'for i in 1 2 3 4 5 6; do echo "line $i of frame #IFRAME#"; sleep 0.5; done',
    ]
    assert (layer["gpus"], layer["gpu_vendor"], layer["gpu_models"]) == (1, "NVIDIA", ["RTX 6000 Ada", "A100"])
    assert layer["gpu_memory_min_bytes"] == 16 * GIB

    expect(page.locator("#job-title")).to_contain_text("web render")
    layer_row = page.locator("#layers-table tr[data-layer]")
    expect(layer_row.locator(".range")).to_have_text("1-3")
    for part in ("1", "NVIDIA", "RTX 6000 Ada", "A100", "16"):
        expect(layer_row.locator(".gpus")).to_contain_text(part)
    headers = page.locator("#frames-table th").all_inner_texts()
    assert "GPU Util %" in [h.strip() for h in headers] and "GPU Mem (GB)" in [h.strip() for h in headers], headers
    expect(rows(page)).to_have_count(3)

    # RUNNING on a fake card: the live utilisation and memory of that card, in the row.
    # (6.5 GiB used: "6.5" in GiB or "7.0" in GB, one decimal either way; never 0.0.)
    page.wait_for_function(
        ROW_WHERE,
        arg={
            ".state": "^RUNNING$",
            ".host": "render-01",
            ".gpu-util": r"^63(\.0+)?\s*%?$",
            ".gpu-mem": r"^(6\.5|7\.0)(\s*GB)?$",
        },
        timeout=30_000,
    )

    # The job list's progress follows too: two of three done is two thirds of the bar.
    page.click('nav a[href="#/jobs"]')
    job_row = page.locator(f'#jobs-table tr[data-job-id="{job_id}"]')
    expect(job_row.locator(".progress")).to_contain_text("2/3", timeout=30_000)
    # (Polled: the bar may animate its widths.)
    page.wait_for_function(
        """id => {
        const cell = document.querySelector(`#jobs-table tr[data-job-id="${id}"] .progress`);
        if (!cell || !cell.textContent.includes('2/3')) return false;
        const segs = [...cell.querySelectorAll('.seg')].map(s => [s.dataset.state, s.getBoundingClientRect().width]);
        const total = segs.reduce((a, [, w]) => a + w, 0);
        const done = segs.filter(([st]) => st === 'SUCCEEDED').reduce((a, [, w]) => a + w, 0);
        return total > 0 && Math.abs(done / total - 2 / 3) < 0.05;
    }""",
        arg=job_id,
        timeout=10_000,
    )
    expect(job_row.locator(".progress")).to_contain_text("3/3", timeout=30_000)

    job_row.locator(".name a, a.name").first.click()
    page.wait_for_url(f"**/#/jobs/{job_id}")
    for i in range(3):
        expect(rows(page).nth(i).locator(".state")).to_have_text("SUCCEEDED", timeout=30_000)
        # Finished: the attempt's mean utilisation (the card read 63 % throughout).
        expect(rows(page).nth(i).locator(".gpu-util")).to_contain_text("63")
    assert_not_reloaded(page)


def test_the_log_viewer_follows_a_running_frame(farm, worker, page):
    alice = farm.token("alice", "user")
    login(page, farm, alice)
    mark_page(page)
    # A GPU frame printing a line every 0.3 s for 6 s, with markup that must stay text.
    script = (
        'i=0; while [ $i -lt 20 ]; do echo "tick $i <b>bold</b><img src=x onerror=window.__xss=1>"; '
        "i=$((i+1)); sleep 0.3; done"
    )
    job = farm.submit(alice, "web follow", {"name": "main", "command": ["sh", "-c", script], "gpus": 1})
    page.goto(f"{farm.url}/#/jobs/{job['id']}")
    expect(rows(page).first.locator(".state")).to_have_text("RUNNING", timeout=30_000)
    rows(page).first.locator('button[data-action="log"]').click()
    panel, log = page.locator("#frame-panel"), page.locator("pre#log-view")
    expect(panel).to_be_visible()
    expect(log).to_contain_text("tick 0")
    first = log.inner_text()
    assert "tick 19" not in first, "the frame ended before the log was open: nothing was followed"
    expect(log).to_contain_text("tick 19", timeout=30_000)
    last = log.inner_text()
    assert last.startswith(first.rstrip("\n").rsplit("\n", 1)[0]), "following must append, not replace"
    assert [line.split(" <")[0] for line in last.splitlines() if line.startswith("tick ")] == [
        f"tick {i}" for i in range(20)
    ], last
    assert "<b>bold</b><img src=x onerror=window.__xss=1>" in last
    assert log.locator("*").count() == 0 and page.evaluate("window.__xss") is None, "log text became markup"

    chart = page.locator("canvas#usage-chart")
    expect(chart).to_be_visible()
    drawn = chart.evaluate("""c => { const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
                                     for (let i = 3; i < d.length; i += 4) if (d[i]) return true; return false; }""")
    assert drawn, "the GPU usage chart is blank"
    page.click("#frame-panel-close")
    expect(panel).to_be_hidden()
    assert_not_reloaded(page)


def test_kill_a_running_frame_after_confirming(farm, worker, page):
    alice = farm.token("alice", "user")
    job = farm.submit(alice, "web kill me", {"name": "main", "command": ["sleep", "120"]})
    login(page, farm, alice)
    page.goto(f"{farm.url}/#/jobs/{job['id']}")
    row = rows(page).first
    expect(row.locator(".state")).to_have_text("RUNNING", timeout=30_000)
    dialog = page.locator("dialog#confirm")

    row.locator('button[data-action="kill"]').click()
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("0001-main")  # it names what would be killed
    page.click("#confirm-cancel")
    expect(dialog).to_be_hidden()
    assert farm.frames(job["id"], alice)[0]["state"] == "RUNNING", "cancel killed the frame"

    row.locator('button[data-action="kill"]').click()
    expect(dialog).to_be_visible()
    page.click("#confirm-ok")
    expect(dialog).to_be_hidden()
    expect(row.locator(".state")).to_have_text("DEAD", timeout=30_000)
    assert farm.frames(job["id"], alice)[0]["state"] == "DEAD"
