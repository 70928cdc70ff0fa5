"""The submit form's GPU version minimums (issue 39 §4): sent as text (8.10 stays 8.10),
kept by the server, and a malformed version shown beside its input."""

from __future__ import annotations

from webfarm import expect, login


def test_version_minimums_from_the_form(farm, page):
    alice = farm.token("alice", "user")
    login(page, farm, alice)
    page.click('nav a[href="#/submit"]')
    form = page.locator("form#submit-form")
    form.locator('[name="name"]').fill("versions")
    form.locator('[name="command"]').fill("true")
    form.locator('[name="gpus"]').fill("1")
    form.locator('[name="gpu_capability_min"]').fill("8.10")
    form.locator('[name="gpu_driver_min"]').fill("535.x")
    page.click("#submit-job")
    error = page.locator('.field-error[data-for="gpu_driver_min"]')
    expect(error).to_contain_text("invalid version")
    expect(form.locator('[name="gpu_driver_min"]')).to_have_attribute("aria-invalid", "true")

    form.locator('[name="gpu_driver_min"]').fill("535.104.05")
    form.locator('[name="gpu_cuda_min"]').fill("12.2")
    page.click("#submit-job")
    page.wait_for_url("**/#/jobs/*")
    job_id = int(page.url.rsplit("/", 1)[1])
    cell = page.locator("#layers-table tr[data-layer] .gpus")
    for part in ("compute \u2265 8.10", "driver \u2265 535.104.05", "CUDA \u2265 12.2"):
        expect(cell).to_contain_text(part)
    (layer,) = farm.api("GET", f"/jobs/{job_id}", token=alice)["layers"]
    assert (layer["gpu_capability_min"], layer["gpu_driver_min"], layer["gpu_cuda_min"]) == (
        "8.10",
        "535.104.05",
        "12.2",
    )
