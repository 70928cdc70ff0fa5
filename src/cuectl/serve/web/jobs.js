// #/jobs: every job with its frame progress, refreshed each second (ETag: a 304 while
// nothing changed costs no body and no DOM work).

import {api, poll} from "./api.js";
import {el, progressBar, setText, updateProgress} from "./dom.js";
import {clearError, showError} from "./ui.js";

const PAGE = 1000;
const TICK_MS = 1000;

export function jobsPage(main) {
  const filter = el("input", {id: "jobs-filter", type: "search", placeholder: "Filter by name or user",
                              "aria-label": "Filter jobs by name or user", autocomplete: "off"});
  const active = el("input", {id: "jobs-active", type: "checkbox"});
  const count = el("span", {class: "muted count", "aria-live": "polite"});
  const tbody = el("tbody");
  const empty = el("p", {class: "muted empty", hidden: true});
  main.append(
    el("div", {class: "toolbar"}, el("h1", {text: "Jobs"}), filter,
       el("label", {class: "check"}, active, " Active only"), count),
    el("div", {class: "table-wrap"}, el("table", {id: "jobs-table"},
      el("thead", {}, el("tr", {},
        ["ID", "Name", "State", "Progress", "User", "Priority", "Pending"]
          .map((h, i) => el("th", {scope: "col", class: ["id", null, null, null, null, "num", null][i], text: h})))),
      tbody)),
    empty);

  const rows = new Map(); // job id -> <tr>
  let jobs = [];
  let etag = null;
  let stopped = false;

  function row(job) {
    let tr = rows.get(job.id);
    if (!tr) {
      const link = el("a", {href: `#/jobs/${job.id}`});
      const progress = progressBar();
      tr = el("tr", {"data-job-id": job.id},
        el("td", {class: "id num", text: job.id}), el("td", {class: "name"}, link), el("td", {class: "state"}),
        el("td", {class: "progress"}, progress), el("td", {class: "user"}), el("td", {class: "priority num"}),
        el("td", {class: "pending"}));
      rows.set(job.id, tr);
    }
    const cell = (name) => tr.querySelector(`.${name}`);
    setText(cell("name").firstChild, job.name);
    setText(cell("user"), job.user);
    setText(cell("priority"), job.priority);
    // A finished job by how it ended (KILLED, FAILED, SUCCEEDED), as `cuectl job list` shows it.
    setText(cell("state"), job.outcome || job.state);
    // "paused" is shown by CSS from this attribute, so .state keeps exactly the job state.
    tr.toggleAttribute("data-paused", job.paused);
    tr.dataset.state = job.state;
    if (job.outcome) tr.dataset.outcome = job.outcome;
    else delete tr.dataset.outcome;
    updateProgress(cell("progress").firstChild, job.frame_counts);
    setText(cell("pending"), job.pending_reason || "");
    return tr;
  }

  function render() {
    const needle = filter.value.trim().toLowerCase();
    const shown = jobs.filter((j) => !needle || j.name.toLowerCase().includes(needle) || j.user.toLowerCase().includes(needle));
    const wanted = shown.map(row);
    // Reorder only when the order changed: moving a row would drop the keyboard focus.
    const current = [...tbody.children];
    if (current.length !== wanted.length || current.some((tr, i) => tr !== wanted[i])) tbody.replaceChildren(...wanted);
    const ids = new Set(jobs.map((j) => j.id));
    for (const id of rows.keys()) if (!ids.has(id)) rows.delete(id);
    const noun = jobs.length === 1 ? "job" : "jobs";
    setText(count, shown.length === jobs.length ? `${jobs.length} ${noun}` : `${shown.length} of ${jobs.length} ${noun}`);
    empty.hidden = shown.length > 0;
    setText(empty, jobs.length ? "No job matches the filter." : "No jobs yet.");
  }

  async function refresh() {
    try {
      // The newest page, newest first: one request per tick whatever the store's size.
      const query = `limit=${PAGE}&order=desc${active.checked ? "&active=true" : ""}`;
      const res = await api(`/jobs?${query}`, {etag});
      if (stopped) return;
      clearError("refresh");
      if (res.status === 304) return;
      etag = res.etag;
      jobs = res.data.jobs;
      render();
    } catch (err) {
      if (!stopped) showError(err, "refresh");
    }
  }

  filter.addEventListener("input", render);
  active.addEventListener("change", () => {
    etag = null;
    ticker.now();
  });
  const ticker = poll(refresh, TICK_MS);
  return () => {
    stopped = true;
    ticker.stop();
  };
}
