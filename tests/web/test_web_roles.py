"""Who may do what: a viewer only looks, a user acts on their own jobs only, an admin on
all. The buttons follow the role, and the API refuses what the buttons would not offer."""

from __future__ import annotations

import pytest
from webfarm import expect, login

# Buttons a person can see (the page may keep hidden ones in the DOM).
JOB_BUTTONS = "#job-actions button:visible"
ROW_ACTIONS = (
    '#frames-table button[data-action="retry"]:visible, #frames-table button[data-action="kill"]:visible, '
    '#frames-table button[data-action="eat"]:visible'
)


@pytest.fixture(scope="module")
def jobs(farm):
    """One job of alice's and one of bob's, WAITING (no worker in this module)."""
    alice, bob = farm.token("alice", "user"), farm.token("bob", "user")
    layer = {"name": "main", "command": ["true"], "range": "1-3"}
    return {"alice": farm.submit(alice, "alice's shot", layer), "bob": farm.submit(bob, "bob's shot", layer)}


def open_job(farm, page, job):
    page.goto(f"{farm.url}/#/jobs/{job['id']}")
    expect(page.locator("#job-title")).to_contain_text(job["name"])
    expect(page.locator("#frames-table tr[data-frame-id]")).to_have_count(3)


def test_a_viewer_sees_read_only_and_cannot_post(farm, page, jobs):
    vera = farm.token("vera", "viewer")
    login(page, farm, vera)
    expect(page.locator("#role-badge")).to_have_text("read-only")
    expect(page.locator('nav a[href="#/jobs"]')).to_be_visible()
    expect(page.locator('a[href="#/submit"]')).to_be_hidden()
    expect(page.locator(f'#jobs-table tr[data-job-id="{jobs["alice"]["id"]}"]')).to_be_visible()
    for job in jobs.values():
        open_job(farm, page, job)
        expect(page.locator(JOB_BUTTONS)).to_have_count(0)
        expect(page.locator(ROW_ACTIONS)).to_have_count(0)
        expect(page.locator('#frames-table button[data-action="log"]')).to_have_count(3)  # looking is fine

    # The API refuses what the page does not offer, whatever a viewer sends by hand.
    frame_id = farm.frames(jobs["alice"]["id"], vera)[0]["id"]
    statuses = page.evaluate(
        """async ([token, job, frame]) => {
        const post = (path, body) => fetch('/api/v1' + path, {method: 'POST', headers: {
            'Authorization': 'Bearer ' + token, 'Content-Type': 'application/json'}, body: JSON.stringify(body)})
            .then(r => r.status);
        return [await post('/jobs/' + job + '/kill', {}), await post('/frames/' + frame + '/eat', {}),
                await post('/jobs', {name: 'sneaky', layers: [{name: 'main', command: ['true']}]})];
    }""",
        [vera.secret, jobs["alice"]["id"], frame_id],
    )
    assert statuses == [403, 403, 403]
    assert farm.api("GET", f"/jobs/{jobs['alice']['id']}", token=vera)["state"] != "FINISHED"


def test_a_user_has_actions_on_their_own_jobs_only(farm, page, jobs):
    alice = farm.token("alice", "user")
    login(page, farm, alice)
    expect(page.locator("#role-badge")).to_have_text("user")
    expect(page.locator('nav a[href="#/submit"]')).to_be_visible()

    open_job(farm, page, jobs["bob"])
    expect(page.locator(JOB_BUTTONS)).to_have_count(0)
    expect(page.locator(ROW_ACTIONS)).to_have_count(0)

    open_job(farm, page, jobs["alice"])
    for action in ("pause", "kill", "retry", "priority"):  # (resume shows once it is paused)
        expect(page.locator(f'#job-actions button[data-action="{action}"]:visible')).to_have_count(1)
    for action in ("retry", "kill", "eat"):
        expect(page.locator(f'#frames-table button[data-action="{action}"]:visible')).to_have_count(3)

    # They work: pause, then change the priority through the dialog.
    page.click('#job-actions button[data-action="pause"]')
    assert_eventually(lambda: farm.api("GET", f"/jobs/{jobs['alice']['id']}", token=alice)["paused"])
    expect(page.locator('#job-actions button[data-action="resume"]')).to_be_visible()
    page.click('#job-actions button[data-action="priority"]')
    expect(page.locator("dialog#confirm")).to_be_visible()
    page.fill("#priority-value", "87")
    page.click("#confirm-ok")
    expect(page.locator("dialog#confirm")).to_be_hidden()
    assert_eventually(lambda: farm.api("GET", f"/jobs/{jobs['alice']['id']}", token=alice)["priority"] == 87)
    page.click('nav a[href="#/jobs"]')
    expect(page.locator(f'#jobs-table tr[data-job-id="{jobs["alice"]["id"]}"] .priority')).to_have_text("87")


def test_an_admin_has_actions_on_every_job(farm, page, jobs):
    login(page, farm, farm.token("ada", "admin"))
    for job in jobs.values():
        open_job(farm, page, job)
        expect(page.locator('#job-actions button[data-action="kill"]:visible')).to_have_count(1)
        expect(page.locator('#frames-table button[data-action="eat"]:visible')).to_have_count(3)


def assert_eventually(check, timeout: float = 10.0) -> None:
    from webfarm import wait_for

    wait_for(check, timeout=timeout, what="the change to reach the store")
