"""Fixtures for the browser tests of the web monitor (docs/web.md): headless Debian Chromium
driven by Playwright against a real ``cuectl serve`` (webfarm.py beside this file).

One browser for the whole run and one farm (store + server) per module keep the suite
quick; every test gets a fresh browser context (its own sessionStorage, so its own login).
Each page is watched for what must never happen: an uncaught script error, a Content
Security Policy violation, a request to any origin but the server's (the pages load
nothing from a CDN), or a dialog box (errors go in #error-banner, never alert()).

Missing Chromium or Playwright fails these tests with the reason and the fix; only
CUECTL_SKIP_BROWSER=1, set on purpose, skips them."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # webfarm

from webfarm import SKIP_ENV, WebFarm, chromium_problem, launch_browser  # noqa: E402

DESKTOP = {"width": 1280, "height": 800}


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    if os.environ.get(SKIP_ENV) == "1":
        pytest.skip(f"{SKIP_ENV}=1: browser tests skipped on request")
    problem = chromium_problem()
    if problem:
        pytest.fail(f"the browser tests cannot run: {problem}", pytrace=False)
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=15_000)  # a loaded 2-core CI machine: generous, never a speed check
    with sync_playwright() as p:
        b = launch_browser(p)
        yield b
        b.close()


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebFarm]:
    f = WebFarm(tmp_path_factory.mktemp("web"))
    try:
        yield f
    finally:
        f.stop()


class PageWatch:
    """What a page did that it never should; checked after each test."""

    def __init__(self, origin: str) -> None:
        self.origin = origin
        self.errors: list[str] = []
        self.foreign: list[str] = []
        self.csp: list[str] = []
        self.dialogs: list[str] = []
        self.banners: list[str] = []

    def attach(self, context: Any) -> None:
        context.on("request", self._request)
        context.on("page", self._page)

    def _page(self, page: Any) -> None:
        page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        page.on("console", self._console)
        page.on("dialog", self._dialog)

    def _request(self, request: Any) -> None:
        url = request.url
        if not (url.startswith(self.origin + "/") or url == self.origin or url.startswith(("data:", "blob:"))):
            self.foreign.append(url)

    def _console(self, msg: Any) -> None:
        text = msg.text
        if "Content Security Policy" in text or "Refused to" in text:
            self.csp.append(text)

    def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    def look(self, context: Any) -> None:
        """Before the context closes: no page shows an error banner it was not meant to."""
        for page in context.pages:
            try:
                banner = page.locator("#error-banner")
                if banner.count() and banner.is_visible():
                    self.banners.append(banner.inner_text())
            except Exception:  # a page that is gone or never loaded the app
                pass

    def check(self, *, banners_ok: bool = False) -> None:
        assert banners_ok or not self.banners, f"unexpected errors shown in #error-banner: {self.banners}"
        assert not self.errors, f"uncaught script errors: {self.errors}"
        assert not self.csp, f"Content Security Policy violations: {self.csp}"
        assert not self.foreign, (
            f"requests to other origins (the pages must load nothing from elsewhere): {self.foreign}"
        )
        assert not self.dialogs, f"native dialog boxes (errors belong in #error-banner): {self.dialogs}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Any:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        # What the test's pages showed when it failed, beside the failure.
        states = []
        for context, _ in getattr(item, "web_contexts", []):
            for page in context.pages:
                try:
                    states.append(repr(page.evaluate(PAGE_STATE)))
                except Exception as exc:  # a page that is gone or never loaded the app
                    states.append(f"unavailable ({exc})")
        if states:
            report.sections.append(("page state at the failure", "\n".join(states)))


# What a failing test's pages looked like (printed, so pytest shows it with the failure).
PAGE_STATE = """() => {
  const out = {url: location.href, banner: (document.querySelector('#error-banner:not([hidden])') || {}).textContent};
  for (const id of ['jobs-table', 'frames-table', 'hosts-table']) {
    const t = document.getElementById(id);
    if (!t) continue;
    let s = t.parentElement;
    while (s && s !== document.body && !/(auto|scroll)/.test(getComputedStyle(s).overflowY)) s = s.parentElement;
    const rows = [...t.querySelectorAll('tr[data-frame-id], tr[data-job-id], tr[data-host]')];
    out[id] = {rows: rows.length, first: rows[0] && rows[0].textContent.slice(0, 60),
               last: rows.length ? rows[rows.length - 1].textContent.slice(0, 60) : null,
               scrollTop: s && s.scrollTop, scrollHeight: s && s.scrollHeight, clientHeight: s && s.clientHeight};
  }
  return out;
}"""


def pytest_configure(config: Any) -> None:
    config.addinivalue_line("markers", "error_banner_ok: the test provokes errors the page shows in #error-banner")


@pytest.fixture
def new_context(request: pytest.FixtureRequest, browser: Any, farm: WebFarm) -> Iterator[Any]:
    """Factory for browser contexts (``new_context(viewport=…, color_scheme=…)``), each
    watched; closed and checked after the test."""
    made: list[tuple[Any, PageWatch]] = []

    def make(**options: Any) -> Any:
        options.setdefault("viewport", DESKTOP)
        context = browser.new_context(**options)
        context.set_default_timeout(15_000)
        watch = PageWatch(farm.url)
        watch.attach(context)
        made.append((context, watch))
        return context

    request.node.web_contexts = made  # for pytest_runtest_makereport: the pages of a failed test
    yield make
    for context, watch in made:
        watch.look(context)
        context.close()
    banners_ok = request.node.get_closest_marker("error_banner_ok") is not None
    for _context, watch in made:
        watch.check(banners_ok=banners_ok)


@pytest.fixture
def page(new_context: Any) -> Any:
    """A 1280x800 page in a fresh context."""
    return new_context().new_page()
