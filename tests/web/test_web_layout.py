"""Layout, keyboard and the offline/CSP guarantees: a phone-sized screen, Tab and Enter,
Escape, dark mode, and pages that load nothing but their own files under a strict CSP."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

import pytest
from webfarm import expect, login

PHONE = {"width": 390, "height": 844}

# Elements wider than the viewport, or sticking out of it, that no horizontally scrolling
# container holds (a table in its own overflow-x: auto box is fine; a page that scrolls
# sideways is not).
OVERFLOWING = """() => {
  const vw = document.documentElement.clientWidth, bad = [];
  const scrolls = el => { for (let p = el.parentElement; p && p !== document.body; p = p.parentElement)
      if (/(auto|scroll|hidden)/.test(getComputedStyle(p).overflowX)) return true; return false; };
  for (const el of document.body.querySelectorAll('*')) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0) continue;
    if ((r.right > vw + 1 || r.left < -1) && !scrolls(el))
      bad.push(el.tagName + (el.id ? '#' + el.id : '') + '.' + el.className + ' ' + Math.round(r.left) + '..' + Math.round(r.right));
  }
  return {vw, scrollWidth: document.documentElement.scrollWidth, bad: bad.slice(0, 10)};
}"""


@pytest.fixture(scope="module")
def job(farm):
    ada = farm.token("ada", "admin")
    # A long name and a name that is markup: both must stay text, in their cells.
    farm.submit(
        ada,
        "<img src=x onerror=window.__xss=1> a shot with a very long name " + "x" * 60,
        {"name": "main", "command": ["true"], "range": "1-5"},
    )
    return farm.submit(
        ada,
        "web layout",
        {
            "name": "main",
            "command": ["true"],
            "range": "1-20",
            "gpus": 1,
            "gpu_models": "A100",
            "gpu_memory_min": "40G",
        },
    )


def test_a_phone_reaches_the_navigation_and_the_whole_jobs_table(farm, new_context, job):
    page = new_context(viewport=PHONE, is_mobile=True, has_touch=True).new_page()
    login(page, farm, farm.token("ada", "admin"))
    table = page.locator("#jobs-table")
    expect(table.locator(f'tr[data-job-id="{job["id"]}"]')).to_be_visible()
    for href in ("#/jobs", "#/hosts", "#/submit"):
        link = page.locator(f'nav a[href="{href}"]')
        expect(link).to_be_visible()
        expect(link).to_be_in_viewport()
    report = page.evaluate(OVERFLOWING)
    assert report["scrollWidth"] <= report["vw"], f"the page scrolls sideways: {report}"
    assert not report["bad"], f"wider than the screen, outside any scroll container: {report}"
    # The last column is reachable by scrolling the table's own container.
    last_cell = table.locator(f'tr[data-job-id="{job["id"]}"] .pending')
    last_cell.scroll_into_view_if_needed()
    expect(last_cell).to_be_in_viewport()
    report = page.evaluate(OVERFLOWING)
    assert report["scrollWidth"] <= report["vw"], f"the page scrolls sideways: {report}"

    page.click('nav a[href="#/hosts"]')
    page.wait_for_url("**/#/hosts")
    expect(page.locator("#hosts-table")).to_be_attached()
    page.goto(f"{farm.url}/#/jobs/{job['id']}")
    expect(page.locator("#frames-table tr[data-frame-id]").first).to_be_visible()
    report = page.evaluate(OVERFLOWING)
    assert report["scrollWidth"] <= report["vw"] and not report["bad"], report


def test_tab_reaches_the_navigation_and_enter_follows_it(farm, page, job):
    login(page, farm, farm.token("ada", "admin"))
    page.locator("body").focus()
    for _ in range(40):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.getAttribute('href')") == "#/hosts":
            break
    else:
        pytest.fail("Tab never reached the Hosts link")
    outline = page.evaluate("""() => { const s = getComputedStyle(document.activeElement);
                                       return [s.outlineStyle, s.outlineWidth, s.boxShadow]; }""")
    assert (outline[0] != "none" and outline[1] != "0px") or outline[2] != "none", f"no visible focus: {outline}"
    page.keyboard.press("Enter")
    page.wait_for_url("**/#/hosts")
    expect(page.locator("#hosts-table")).to_be_attached()


def test_escape_closes_the_confirm_dialog_and_the_frame_panel(farm, page, job):
    ada = farm.token("ada", "admin")
    login(page, farm, ada)
    page.goto(f"{farm.url}/#/jobs/{job['id']}")
    dialog = page.locator("dialog#confirm")
    page.click('#job-actions button[data-action="kill"]')
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("web layout")
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    assert farm.frames(job["id"], ada)[0]["state"] == "WAITING", "Escape must not confirm"

    page.locator('#frames-table tr[data-frame-id] button[data-action="log"]').first.click()
    expect(page.locator("#frame-panel")).to_be_visible()
    page.keyboard.press("Escape")
    expect(page.locator("#frame-panel")).to_be_hidden()


def test_dark_mode_follows_the_system_setting(farm, new_context, job):
    def background(scheme):
        page = new_context(color_scheme=scheme).new_page()
        login(page, farm, farm.token("ada", "admin"))
        return page.evaluate("""() => { for (const el of [document.body, document.documentElement]) {
              const c = getComputedStyle(el).backgroundColor;
              if (c && c !== 'rgba(0, 0, 0, 0)' && c !== 'transparent') return c; } return 'rgb(255, 255, 255)'; }""")

    def luminance(css):
        r, g, b = (int(x) for x in re.findall(r"\d+", css)[:3])
        return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255

    light, dark = background("light"), background("dark")
    assert luminance(light) > 0.6 and luminance(dark) < 0.3, (light, dark)


def test_markup_in_a_job_name_stays_text(farm, page, job):
    login(page, farm, farm.token("ada", "admin"))
    cell = page.locator("#jobs-table .name").filter(has_text="<img src=x onerror=window.__xss=1>")
    expect(cell).to_have_count(1)
    assert cell.locator("img").count() == 0 and page.evaluate("window.__xss") is None


class _Inline(HTMLParser):
    def __init__(self):
        super().__init__()
        self.problems: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        names = dict(attrs)
        if "style" in names or any(n.startswith("on") for n in names):
            self.problems.append(f"inline style/handler on <{tag}>: {attrs}")
        if tag == "style":
            self.problems.append("a <style> element")
        if tag == "script" and not names.get("src"):
            self._in_script = True
        for key in ("src", "href"):
            value = names.get(key) or ""
            if re.match(r"(https?:)?//", value):
                self.problems.append(f"<{tag} {key}={value}>: not from this server")

    def handle_data(self, data):
        if self._in_script and data.strip():
            self.problems.append("an inline <script>")

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_script = False


def crawl(farm) -> dict[str, str]:
    """The page and every file it loads, followed from index.html through the scripts'
    imports: path -> text."""
    seen: dict[str, str] = {}
    todo = ["/"]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        reply = farm.request("GET", path)
        assert reply.status == 200, (path, reply.status)
        seen[path] = text = reply.body.decode()
        if path == "/" or path.endswith(".html"):
            refs = re.findall(r"""(?:src|href)\s*=\s*["']([^"'#][^"']*)["']""", text)
        elif path.endswith(".js"):
            refs = re.findall(r"""(?:\bfrom\s*|\bimport\s*\(?\s*)["'](\.{1,2}/[^"']+)["']""", text)
        else:
            refs = re.findall(r"""url\(\s*["']?([^"')]+)""", text)
        for ref in refs:
            if re.match(r"(https?:)?//", ref):
                raise AssertionError(f"{path} loads {ref}: everything must come from this server")
            if not ref.startswith("data:"):
                todo.append(urlsplit(urljoin(farm.url + path, ref)).path)
    return seen


def test_the_pages_are_self_contained_under_a_strict_csp(farm):
    import urllib.request

    with urllib.request.urlopen(farm.url + "/", timeout=10) as resp:
        csp = resp.headers.get("Content-Security-Policy", "")
    assert "default-src 'self'" in csp, csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp, csp
    files = crawl(farm)
    assert any(p.endswith(".js") for p in files) and any(p.endswith(".css") for p in files), sorted(files)
    parser = _Inline()
    parser.feed(files["/"])
    assert not parser.problems, parser.problems
    for path, text in files.items():
        if path.endswith(".js"):
            # (Comments may name what the code avoids; emptying an element with
            # innerHTML = "" inserts nothing and is allowed.)
            code = re.sub(r"/\*.*?\*/|(?m:(^|\s)//.*$)", " ", text, flags=re.S)
            html = re.sub(r"""\.innerHTML\s*=\s*(''|""|``)""", "", code)
            found = re.findall(
                r"\b(?:innerHTML|outerHTML|insertAdjacentHTML|document\.write)\b|\beval\(|"
                r"""new Function\(|setAttribute\(\s*['"]style['"]""",
                html,
            )
            assert not found, f"{path}: {found}: API data goes in as text or attributes, never as HTML or code"
