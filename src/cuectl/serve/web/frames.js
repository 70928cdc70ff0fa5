// The frames table of a job page, virtualised: a job may have 10,000 frames or more, and
// building that many rows would take seconds. Rows have one fixed height; only those in
// view (plus a margin) exist, between two spacer rows that keep the scroll height right.
// Small lists (ALL_ROWS or fewer) are rendered whole. Columns sort on a click (the whole
// list, not the rows in view); rows the caller may change have a checkbox for bulk actions.

import {el, FRAME_STATES, gb, pct, runtime, setText} from "./dom.js";
import {sortable} from "./table.js";

const ALL_ROWS = 300;
const OVERSCAN = 20;
const HEADERS = ["", "Frame", "State", "Host", "GPU", "Attempts", "GPU Util %", "GPU Mem (GB)", "Runtime", "Exit", "Actions"];
const CLASSES = ["select", "frame", "state", "host", "gpu", "attempts", "gpu-util", "gpu-mem", "runtime", "exit", "actions"];
const NUMERIC = new Set(["Attempts", "GPU Util %", "GPU Mem (GB)", "Runtime", "Exit"]);
// Which frame actions do something in which state (the store's rules, sql.py _apply_action).
// Anything else is a no-op, which the server answers 409. A WAITING frame in its retry
// back-off (retry_at) may be retried now. Also which frames a bulk action is sent to.
export const ENABLED = {
  retry: (f) => f.state !== "DEPEND" && (f.state !== "WAITING" || !!f.retry_at),
  kill: (f) => f.state === "RUNNING" || f.state === "WAITING" || f.state === "DEPEND",
  eat: (f) => f.state !== "EATEN",
};

const seconds = (f) => {
  if (!f.started_at) return null;
  const end = f.ended_at ? Date.parse(f.ended_at) : f.state === "RUNNING" ? Date.now() : null;
  return end === null ? null : (end - Date.parse(f.started_at)) / 1000;
};
const live = (f, running, done) => (f.state === "RUNNING" ? f[running] : f[done]) ?? null;

/** The table; ``onAction(action, frame)`` for the row buttons (log, retry, kill, eat);
 * ``gpuLabel(frame)`` -> {text, title} for the GPU column; ``onSelect(ids)`` after the
 * selection changes. */
export function framesTable(onAction, {gpuLabel = () => ({text: "-", title: ""}), onSelect = () => {}} = {}) {
  const spacer = () => el("tr", {class: "spacer", "aria-hidden": "true", hidden: true}, el("td", {colspan: HEADERS.length}));
  const top = spacer();
  const bottom = spacer();
  const tbody = el("tbody", {}, top, bottom);
  const ths = HEADERS.map((h, i) => el("th", {scope: "col", class: `${CLASSES[i]}${NUMERIC.has(h) ? " num" : ""}`, text: h}));
  const all = el("input", {type: "checkbox", id: "frames-select-all", "aria-label": "Select every frame shown", hidden: true});
  ths[0].append(all);
  const table = el("table", {id: "frames-table", class: "fixed"},
    el("thead", {}, el("tr", {"aria-rowindex": 1}, ths)), tbody);
  const wrap = el("div", {class: "table-wrap frames-wrap"}, table);

  let source = [];         // the frames to show, in the job's order (a state filter applied)
  let list = [];           // the same, sorted as the headers say
  const selected = new Set(); // frame ids
  let byId = new Map();
  let mayChange = false;   // show retry/kill/eat
  let rendered = new Map(); // frame id -> <tr> now in the table
  let rowHeight = 0;       // measured from the first row drawn
  let queued = false;

  const sorter = sortable(ths, [null, (f) => f.id, (f) => FRAME_STATES.indexOf(f.state), (f) => f.host,
    (f) => gpuLabel(f).text, (f) => f.attempts, (f) => live(f, "gpu_util_pct", "gpu_util_mean_pct"),
    (f) => live(f, "gpu_memory_used_bytes", "gpu_memory_peak_bytes"), seconds,
    (f) => f.exit_code ?? (f.exit_signal ? 1000 + f.exit_signal : null), null], () => {
    list = sorter.sort(source);
    draw();
  });

  function build(frame) {
    const buttons = [el("button", {type: "button", class: "small", "data-action": "log", text: "Log",
                                   "aria-label": `Log and GPU use of frame ${frame.name}`})];
    if (mayChange) {
      for (const action of ["retry", "kill", "eat"]) {
        buttons.push(el("button", {type: "button", class: "small", "data-action": action,
                                   text: action[0].toUpperCase() + action.slice(1),
                                   "aria-label": `${action} frame ${frame.name}`}));
      }
    }
    const box = el("input", {type: "checkbox", class: "select-row", "aria-label": `Select frame ${frame.name}`, hidden: !mayChange});
    return el("tr", {"data-frame-id": frame.id},
      el("td", {class: "select"}, box),
      el("td", {class: "frame", text: frame.name, title: frame.name}), el("td", {class: "state"}), el("td", {class: "host"}),
      el("td", {class: "gpu"}),
      el("td", {class: "attempts num"}), el("td", {class: "gpu-util num"}), el("td", {class: "gpu-mem num"}),
      el("td", {class: "runtime num"}), el("td", {class: "exit num"}), el("td", {class: "actions"}, el("span", {class: "buttons"}, buttons)));
  }

  function fill(tr, f, now) {
    const cells = tr.children;
    const running = f.state === "RUNNING";
    tr.dataset.state = f.state;
    if (f.pending_action) tr.dataset.pending = f.pending_action;
    else delete tr.dataset.pending;
    cells[0].firstChild.checked = selected.has(f.id);
    setText(cells[2], f.state);
    setText(cells[3], f.host || "-");
    const gpu = gpuLabel(f);
    // The host is in the column before: "render-01 | gpu 1 (A100-SXM4-80GB)".
    setText(cells[4], f.host && gpu.text.startsWith(`${f.host} gpu `) ? gpu.text.slice(f.host.length + 1) : gpu.text);
    if (cells[4].title !== gpu.title) cells[4].title = gpu.title;
    setText(cells[5], f.attempts);
    // Live values while it runs; the finished attempt's mean and peak afterwards.
    setText(cells[6], pct(running ? f.gpu_util_pct : f.gpu_util_mean_pct));
    setText(cells[7], gb(running ? f.gpu_memory_used_bytes : f.gpu_memory_peak_bytes));
    setText(cells[8], runtime(f, now));
    setText(cells[9], f.exit_code ?? (f.exit_signal ? `sig ${f.exit_signal}` : "-"));
    for (const button of cells[10].firstChild.children) {
      const enabled = ENABLED[button.dataset.action];
      if (enabled) button.disabled = !enabled(f);
    }
  }

  function draw() {
    queued = false;
    const n = list.length;
    let first = 0;
    let last = n;
    const h = rowHeight || 34;
    if (n > ALL_ROWS) {
      first = Math.max(0, Math.floor(wrap.scrollTop / h) - OVERSCAN);
      last = Math.min(n, Math.ceil((wrap.scrollTop + wrap.clientHeight) / h) + OVERSCAN);
    }
    const now = Date.now();
    const rows = [];
    const next = new Map();
    for (let i = first; i < last; i++) {
      const f = list[i];
      const tr = rendered.get(f.id) || build(f);
      fill(tr, f, now);
      tr.classList.toggle("odd", i % 2 === 1); // striping by position in the list, not in the DOM
      tr.setAttribute("aria-rowindex", i + 2);
      next.set(f.id, tr);
      rows.push(tr);
    }
    rendered = next;
    top.hidden = first === 0;
    bottom.hidden = last === n;
    top.firstChild.style.height = `${first * h}px`;
    bottom.firstChild.style.height = `${(n - last) * h}px`;
    table.setAttribute("aria-rowcount", n + 1);
    // Touch the DOM order only when the window moved: moving a row loses the focus in it.
    const current = tbody.children;
    if (current.length !== rows.length + 2 || rows.some((tr, i) => current[i + 1] !== tr)) {
      const focused = document.activeElement;
      tbody.replaceChildren(top, ...rows, bottom);
      if (focused && focused !== document.body && tbody.contains(focused)) focused.focus({preventScroll: true});
    }
    if (!rowHeight && rows.length) {
      rowHeight = rows[0].getBoundingClientRect().height || 34;
      if (n > ALL_ROWS) draw(); // again with the real height
    }
  }

  const schedule = () => {
    if (!queued) {
      queued = true;
      requestAnimationFrame(draw);
    }
  };
  wrap.addEventListener("scroll", schedule, {passive: true});
  window.addEventListener("resize", schedule);
  function selectionChanged() {
    all.hidden = !mayChange || !list.length;
    all.checked = list.length > 0 && list.every((f) => selected.has(f.id));
    all.indeterminate = !all.checked && list.some((f) => selected.has(f.id));
    onSelect(selected);
  }
  all.addEventListener("change", () => {
    for (const f of list) (all.checked ? selected.add(f.id) : selected.delete(f.id));
    draw();
    selectionChanged();
  });
  tbody.addEventListener("change", (event) => {
    const box = event.target.closest("input.select-row");
    const tr = box && box.closest("tr[data-frame-id]");
    if (!tr) return;
    if (box.checked) selected.add(Number(tr.dataset.frameId));
    else selected.delete(Number(tr.dataset.frameId));
    selectionChanged();
  });
  tbody.addEventListener("click", (event) => {
    const button = event.target.closest("button[data-action]");
    const tr = button && button.closest("tr[data-frame-id]");
    const frame = tr && byId.get(Number(tr.dataset.frameId));
    if (frame) onAction(button.dataset.action, frame, button);
  });

  return {
    element: wrap,
    /** Show these frames (already filtered); ``reset`` scrolls back to the top. */
    show(frames, {reset = false, canChange = mayChange} = {}) {
      table.classList.toggle("no-select", !canChange);
      if (canChange !== mayChange) {
        mayChange = canChange;
        rendered = new Map(); // rebuild the rows with or without the action buttons
        if (!mayChange) selected.clear();
      }
      source = frames;
      list = sorter.sort(frames);
      byId = new Map(frames.map((f) => [f.id, f]));
      if (reset) wrap.scrollTop = 0;
      draw();
      selectionChanged();
    },
    /** The selected frames' ids (of any state filter: a chip hides rows, not the choice). */
    selected: () => selected,
    clearSelection() {
      selected.clear();
      draw();
      selectionChanged();
    },
    /** Redraw the rows in view (live values and runtimes changed in place). */
    redraw: draw,
    dispose() {
      window.removeEventListener("resize", schedule);
    },
  };
}
