// #/jobs: every job with its frame progress, refreshed each second (ETag: a 304 while
// nothing changed costs no body and no DOM work). Columns sort on a click; jobs the caller
// may change have a checkbox, and the selected ones are paused, resumed, retried or killed
// together (one request each: the server applies the owner and admin rules to each).

import {api, poll} from "./api.js";
import {el, progressBar, setText, updateProgress} from "./dom.js";
import {clearError, confirmDialog, showError} from "./ui.js";
import {bulkBar, bulkFailure, postAll, sortable} from "./table.js";

const PAGE = 1000;
const TICK_MS = 1000;

const BULK = [["pause", "Pause"], ["resume", "Resume"], ["retry", "Retry dead"], ["kill", "Kill", true]];
// Which jobs each bulk action is sent to: the rest would be a no-op (the server answers
// those 409), such as resuming a job that is not paused.
const APPLIES = {
  pause: (j) => !j.paused && j.state !== "FINISHED",
  resume: (j) => j.paused,
  kill: (j) => j.state !== "FINISHED",
  retry: (j) => (j.frame_counts.DEAD || 0) + (j.frame_counts.EATEN || 0) > 0,
};
const BULK_CONFIRM = {
  kill: ["Kill", "Their running frames are stopped and every unfinished frame is eaten."],
  retry: ["Retry", "Their DEAD and EATEN frames run again."],
};

export function jobsPage(main, ctx) {
  const filter = el("input", {id: "jobs-filter", type: "search", placeholder: "Filter by name or user",
                              "aria-label": "Filter jobs by name or user", autocomplete: "off"});
  const active = el("input", {id: "jobs-active", type: "checkbox"});
  const count = el("span", {class: "muted count", "aria-live": "polite"});
  const tbody = el("tbody");
  const empty = el("p", {class: "muted empty", hidden: true});
  const all = el("input", {type: "checkbox", id: "jobs-select-all", "aria-label": "Select every job shown that you may change"});
  const ths = ["", "ID", "Name", "State", "Progress", "User", "Priority", "Pending"]
    .map((h, i) => el("th", {scope: "col", class: ["select", "id", "name", "state", "progress", "user", "priority num", "pending"][i], text: h}));
  ths[0].append(all);
  const table = el("table", {id: "jobs-table", class: "fixed no-select"}, el("thead", {}, el("tr", {}, ths)), tbody);
  const selected = new Set(); // job ids
  const bar = bulkBar("jobs-bulk", BULK, bulk, () => {
    selected.clear();
    render();
  });
  main.append(
    el("div", {class: "toolbar"}, el("h1", {text: "Jobs"}), filter,
       el("label", {class: "check"}, active, " Active only"), count),
    bar.element,
    el("div", {class: "table-wrap"}, table),
    empty);
  const done = (j) => {
    const c = j.frame_counts || {};
    const total = Object.values(c).reduce((a, b) => a + b, 0);
    return total ? ((c.SUCCEEDED || 0) + (c.EATEN || 0)) / total : 0;
  };
  const sorter = sortable(ths, [null, (j) => j.id, (j) => j.name, (j) => j.display_state || j.outcome || j.state, done, (j) => j.user,
                                (j) => j.priority, (j) => j.pending_reason || null], () => render());

  const rows = new Map(); // job id -> <tr>
  let jobs = [];
  let shown = [];
  let etag = null;
  let stopped = false;

  function row(job) {
    let tr = rows.get(job.id);
    if (!tr) {
      const link = el("a", {href: `#/jobs/${job.id}`});
      const progress = progressBar();
      const box = el("input", {type: "checkbox", class: "select-row", "aria-label": `Select job ${job.name}`});
      box.addEventListener("change", () => {
        if (box.checked) selected.add(job.id);
        else selected.delete(job.id);
        render();
      });
      tr = el("tr", {"data-job-id": job.id},
        el("td", {class: "select"}, box),
        el("td", {class: "id num", text: job.id}), el("td", {class: "name"}, link), el("td", {class: "state"}),
        el("td", {class: "progress"}, progress), el("td", {class: "user"}), el("td", {class: "priority num"}),
        el("td", {class: "pending"}));
      rows.set(job.id, tr);
    }
    const cell = (name) => tr.querySelector(`.${name}`);
    setText(cell("name").firstChild, job.name);
    cell("name").title = job.name; // the whole name, where the column cuts it short
    const box = cell("select").firstChild;
    box.hidden = !ctx.canChange(job); // the server checks again; a box only where it may work
    if (box.hidden) selected.delete(job.id);
    box.checked = selected.has(job.id);
    setText(cell("user"), job.user);
    setText(cell("priority"), job.priority);
    // As `cuectl job list` shows it: RUNNING while a frame runs (display_state), a finished
    // job by how it ended (KILLED, FAILED, SUCCEEDED).
    setText(cell("state"), job.display_state || job.outcome || job.state);
    tr.dataset.display = job.display_state || job.outcome || job.state;
    // "paused" is shown by CSS from this attribute, so .state keeps exactly the job state.
    tr.toggleAttribute("data-paused", job.paused);
    tr.dataset.state = job.state;
    if (job.outcome) tr.dataset.outcome = job.outcome;
    else delete tr.dataset.outcome;
    updateProgress(cell("progress").firstChild, job.frame_counts);
    setText(cell("pending"), job.pending_reason || "");
    cell("pending").title = job.pending_reason || "";
    return tr;
  }

  function render() {
    const needle = filter.value.trim().toLowerCase();
    shown = sorter.sort(jobs.filter((j) => !needle || j.name.toLowerCase().includes(needle) || j.user.toLowerCase().includes(needle)));
    const wanted = shown.map(row);
    // Reorder only when the order changed: moving a row would drop the keyboard focus.
    const current = [...tbody.children];
    if (current.length !== wanted.length || current.some((tr, i) => tr !== wanted[i])) tbody.replaceChildren(...wanted);
    const ids = new Set(jobs.map((j) => j.id));
    for (const id of rows.keys()) if (!ids.has(id)) rows.delete(id);
    for (const id of selected) if (!ids.has(id)) selected.delete(id);
    const mine = shown.filter((j) => ctx.canChange(j));
    table.classList.toggle("no-select", !ctx.me || ctx.me.read_only);
    all.hidden = !mine.length;
    all.checked = mine.length > 0 && mine.every((j) => selected.has(j.id));
    all.indeterminate = !all.checked && mine.some((j) => selected.has(j.id));
    const picked = jobs.filter((j) => selected.has(j.id));
    bar.update(selected.size, "job", (action) => picked.some(APPLIES[action]));
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

  async function bulk(action) {
    const chosen = jobs.filter((j) => selected.has(j.id));
    const picked = chosen.filter(APPLIES[action]);
    if (!picked.length) return;
    const skipped = chosen.length - picked.length;
    const names = picked.slice(0, 5).map((j) => `\u201c${j.name}\u201d (#${j.id})`).join(", ") + (picked.length > 5 ? ", \u2026" : "");
    const noun = `${picked.length} job${picked.length === 1 ? "" : "s"}`;
    if (BULK_CONFIRM[action]) {
      const [verb, effect] = BULK_CONFIRM[action];
      const alone = skipped ? ` ${skipped} selected job${skipped === 1 ? " is" : "s are"} left alone (nothing to ${action}).` : "";
      if (!(await confirmDialog(`${verb} ${noun}: ${names}?${alone} ${effect}`, {ok: `${verb} ${noun}`}))) return;
    }
    const {failed} = await postAll(picked.map((j) => `/jobs/${j.id}/${action}`), {
      onProgress: (n, total) => bar.progress(`${action}: ${n} of ${total}\u2026`)});
    bar.progress(null);
    if (stopped) return;
    render();
    if (failed.length) showError(bulkFailure(action, picked.length, failed, "job"));
    etag = null;
    ticker.now();
  }

  all.addEventListener("change", () => {
    for (const j of shown) if (ctx.canChange(j)) (all.checked ? selected.add(j.id) : selected.delete(j.id));
    render();
  });
  filter.addEventListener("input", render);
  active.addEventListener("change", () => {
    etag = null;
    ticker.now();
  });
  const ticker = poll(refresh, TICK_MS);
  ctx.ready().then(() => !stopped && jobs.length && render(), () => {}); // the checkboxes follow the role
  return () => {
    stopped = true;
    ticker.stop();
  };
}
