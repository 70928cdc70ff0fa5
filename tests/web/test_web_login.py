"""Logging in with a token, staying logged in (or not), logging out, and a revoked token."""

from __future__ import annotations

from webfarm import expect, login


def test_a_bad_token_shows_an_error_and_stays_on_the_login_page(farm, page):
    page.goto(farm.url + "/")
    page.wait_for_url("**/#/login")  # nobody is logged in: every route leads here
    expect(page.locator("#token")).to_have_attribute("type", "password")
    page.fill("#token", "cuectl_not_a_real_token")
    page.click("#login-submit")
    error = page.locator("#login-error")
    expect(error).to_be_visible()
    expect(error).not_to_have_text("")
    assert page.url.endswith("#/login")


def test_a_good_token_opens_the_jobs_page_as_its_user(farm, page):
    ada = farm.token("ada", "admin")
    job = farm.submit(ada, "login shows the queue")
    login(page, farm, ada)
    expect(page.locator("#whoami")).to_have_text("ada")
    expect(page.locator("#role-badge")).to_have_text("admin")
    row = page.locator(f'#jobs-table tr[data-job-id="{job["id"]}"]')
    expect(row.locator(".name")).to_have_text("login shows the queue")
    expect(row.locator(".user")).to_have_text("ada")
    for href in ("#/jobs", "#/hosts", "#/submit"):
        expect(page.locator(f'nav a[href="{href}"]')).to_be_visible()


def test_the_token_stays_with_the_tab_unless_remember_me_is_ticked(farm, new_context):
    ada = farm.token("ada", "admin")
    context = new_context()
    login(context.new_page(), farm, ada)
    other_tab = context.new_page()  # sessionStorage is per tab
    other_tab.goto(farm.url + "/#/jobs")
    other_tab.wait_for_url("**/#/login")

    context = new_context()
    login(context.new_page(), farm, ada, remember=True)
    other_tab = context.new_page()  # localStorage is shared by the tabs of the origin
    other_tab.goto(farm.url + "/#/jobs")
    expect(other_tab.locator("#whoami")).to_have_text("ada")
    assert other_tab.url.endswith("#/jobs")


def test_logout_forgets_the_token(farm, page):
    login(page, farm, farm.token("ada", "admin"), remember=True)
    page.click("#logout")
    page.wait_for_url("**/#/login")
    page.goto(farm.url + "/#/hosts")
    page.wait_for_url("**/#/login")
    assert page.evaluate("sessionStorage.length + localStorage.length") == 0, "the token is still stored"


def test_a_revoked_token_returns_to_the_login_page_with_a_message(farm, page):
    token = farm.token("rita", "user", fresh=True)
    login(page, farm, token)
    farm.cuectl("admin", "token", "revoke", str(token.id))
    # The next live refresh (about a second) gets 401: back to the login page, saying why.
    page.wait_for_url("**/#/login", timeout=15_000)
    expect(page.locator("#login-error")).not_to_have_text("")
