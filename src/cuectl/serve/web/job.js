// #/jobs/<id>: the job, its layers, its frames (virtualised, frames.js) with live GPU
// values, state filter chips, actions, and the frame panel (panel.js).
//
// Live updates without downloading the frame list every second. Each tick asks for
//   1. the job (If-None-Match: 304 while unchanged), for its frame_counts;
//   2. the RUNNING frames (frames?state=RUNNING, ETag'd too): their live GPU values;
//   3. the frames that were RUNNING last tick and are not now (frames?ids=...): how they ended.
// Only when the job's counts disagree with the frames we hold for two ticks in a row (a
// retry or an eat, dependencies released, frames that started and ended between two
// ticks) is the whole list fetched again: at once when the counts held still since the
// last tick, else at most every FULL_MS, so a busy 10,000-frame job is not downloaded each
// second. One tick's disagreement is only the two responses being a moment apart.

import {api, poll} from "./api.js";
import {commandText, el, FRAME_STATES, localTime, progressBar, setText, size, updateProgress} from "./dom.js";
import {ENABLED as APPLIES, framesTable} from "./frames.js";
import {framePanel} from "./panel.js";
import {bulkBar, bulkFailure, postAll} from "./table.js";
import {clearError, confirmDialog, showError} from "./ui.js";
import {deviceNames, gpuLabel} from "./hosts.js";

const TICK_MS = 1000;
const FULL_MS = 5000;
const FIRST = 500;    // the first page of a job's frames: on screen while the rest loads
const PAGE = 10000;   // the API's largest page
const IDS = 1000;     // the API's most ids per request

const JOB_CONFIRM = {
  kill: ["Kill job", "Its running frames are stopped and every unfinished frame is eaten."],
  retry: ["Retry job", "Its DEAD and EATEN frames run again."],
};
const FRAME_CONFIRM = {
  retry: ["Retry frame", "It runs again (a running frame is stopped first)."],
  kill: ["Kill frame", "It is stopped and marked DEAD."],
  eat: ["Eat frame", "It is marked done without running; frames that depend on it are released."],
};

function gpuText(layer) {
  if (!layer.gpus) return "none";
  const parts = [`${layer.gpus} \u00d7 ${layer.gpu_vendor || "any vendor"}`];
  parts.push((layer.gpu_models || []).length ? layer.gpu_models.join(", ") : "any model");
  if (layer.gpu_memory_min_bytes) parts.push(`\u2265 ${size(layer.gpu_memory_min_bytes)}`);
  for (const [key, what] of [["gpu_capability_min", "compute"], ["gpu_driver_min", "driver"], ["gpu_cuda_min", "CUDA"]]) {
    if (layer[key]) parts.push(`${what} \u2265 ${layer[key]}`);
  }
  return parts.join(" \u00b7 ");
}

const BULK = [["retry", "Retry"], ["kill", "Kill", true], ["eat", "Eat", true]];

export function jobPage(main, ctx, idText) {
  const id = Number(idText);
  const title = el("h1", {id: "job-title", text: `Job ${id}`});
  const stateBadge = el("span", {class: "badge state"});
  const actions = el("div", {id: "job-actions", class: "actions"}); // buttons only for who may use them
  const meta = el("p", {class: "muted job-meta"});
  const progress = progressBar();
  const layersBody = el("tbody");
  const chips = el("div", {id: "state-chips", role: "group", "aria-label": "Show only frames in these states"},
    FRAME_STATES.map((s) => el("button", {type: "button", class: "chip", "data-state": s, "aria-pressed": "false"},
      el("span", {class: "label", text: s}), " ", el("span", {class: "n", text: "0"}))));
  // GPU uuid -> {host, index, model}: frames name their devices by uuid; a person reads
  // "render-01 gpu 1 (A100)". From GET /hosts, again (at most every NAMES_MS) when a frame
  // names a device not yet known.
  let names = new Map();
  let namesAt = 0;
  const NAMES_MS = 10000;
  async function loadNames() {
    namesAt = Date.now();
    try {
      names = deviceNames((await api("/hosts")).data.hosts);
      if (!stopped && job) showFrames();
    } catch (err) {
      // Only the labels are missing (uuids are shown instead): not worth a banner.
    }
  }
  const label = (f) => {
    const uuids = f.gpu_uuids || [];
    if (uuids.some((u) => !names.has(u)) && Date.now() - namesAt > NAMES_MS) loadNames();
    return gpuLabel(uuids, names, f.host);
  };
  const bar = bulkBar("frames-bulk", BULK, bulk, () => table.clearSelection());
  const table = framesTable(frameAction, {gpuLabel: label, onSelect: () => updateBar()});
  main.append(
    el("div", {class: "toolbar"}, title, stateBadge, actions),
    meta,
    el("div", {class: "job-progress"}, progress),
    el("h2", {text: "Layers"}),
    el("div", {class: "table-wrap"}, el("table", {id: "layers-table"},
      el("thead", {}, el("tr", {}, ["Layer", "Command", "Range", "Chunk", "GPUs", "Cores", "Memory", "Tags", "Depends"]
        .map((h) => el("th", {scope: "col", text: h})))), layersBody)),
    el("div", {class: "toolbar"}, el("h2", {text: "Frames"}), chips),
    bar.element,
    table.element);

  let job = null;
  let jobEtag = null;
  let frames = [];           // every frame of the job, in id order
  let byId = new Map();
  let running = new Set();   // ids RUNNING at the last tick
  let runEtag = null;
  let lastCounts = "";
  let lastFull = 0;
  let disagreed = false; // the last tick's frames disagreed with its counts
  let loading = null;        // the full load in flight
  let panel = null;
  let stopped = false;
  let ticker = null;

  const selected = () => new Set([...chips.children].filter((c) => c.getAttribute("aria-pressed") === "true")
    .map((c) => c.dataset.state));
  const canChange = () => !!job && ctx.canChange(job);

  function updateBar() {
    const picked = [...table.selected()].map((i) => byId.get(i)).filter(Boolean);
    bar.update(picked.length, "frame", (action) => picked.some(APPLIES[action]));
  }

  async function bulk(action) {
    const picked = [...table.selected()].map((i) => byId.get(i)).filter(Boolean);
    const apply = picked.filter(APPLIES[action]);
    if (!apply.length) return;
    const [verb, effect] = FRAME_CONFIRM[action];
    const list = apply.slice(0, 5).map((f) => f.name).join(", ") + (apply.length > 5 ? ", \u2026" : "");
    const skipped = picked.length - apply.length;
    const noun = `${apply.length} frame${apply.length === 1 ? "" : "s"}`;
    const text = `${verb} ${noun} of job \u201c${job.name}\u201d (${list})?` +
      (skipped ? ` ${skipped} selected frame${skipped === 1 ? " is" : "s are"} left alone (nothing to ${action}).` : "") +
      ` ${effect.replace(/^It is/, "Each is").replace(/^It /, "Each ")}`;
    if (!(await confirmDialog(text, {ok: `${verb.split(" ")[0]} ${noun}`}))) return;
    const ing = {retry: "Retrying", kill: "Killing", eat: "Eating"}[action];
    const {done, failed} = await postAll(apply.map((f) => `/frames/${f.id}/${action}`), {
      parallel: 6, onProgress: (n, total) => bar.progress(`${ing}\u2026 ${n} of ${total}`)});
    bar.progress(null);
    if (stopped) return;
    for (const answer of done) merge(answer.frames);
    if (failed.length) showError(bulkFailure(action, apply.length, failed, "frame"));
    showFrames();
    jobEtag = null;
    if (ticker) ticker.now();
  }

  function showFrames(reset = false) {
    const wanted = selected();
    table.show(wanted.size ? frames.filter((f) => wanted.has(f.state)) : frames, {reset, canChange: canChange()});
    updateBar();
  }

  function showJob() {
    setText(title, job.name);
    document.title = `${job.name} \u00b7 cuectl`;
    const shown = job.display_state || job.outcome || job.state; // RUNNING while a frame runs; a finished job by how it ended
    setText(stateBadge, job.paused && job.state !== "FINISHED" ? `${shown} \u00b7 paused` : shown);
    stateBadge.dataset.state = job.state;
    stateBadge.dataset.display = shown;
    setText(meta, [`#${job.id}`, `user ${job.user}`, `priority ${job.priority}`, `submitted ${localTime(job.created_at)}`,
      job.finished_at ? `finished ${localTime(job.finished_at)}` : null, job.pending_reason].filter(Boolean).join(" \u00b7 "));
    updateProgress(progress, job.frame_counts);
    for (const chip of chips.children) setText(chip.querySelector(".n"), job.frame_counts[chip.dataset.state] || 0);
    if (canChange() && !actions.children.length) {
      actions.append(...[["pause", "Pause"], ["resume", "Resume"], ["retry", "Retry dead"], ["kill", "Kill"],
        ["priority", "Priority\u2026"]].map(([action, label]) => el("button", {type: "button", "data-action": action,
                                                                           text: label, class: action === "kill" ? "danger" : null})));
    }
    if (actions.children.length) {
      actions.querySelector('[data-action="pause"]').hidden = job.paused;
      actions.querySelector('[data-action="resume"]').hidden = !job.paused;
    }
    if (!layersBody.children.length) {
      layersBody.append(...(job.layers || []).map((l) => el("tr", {"data-layer": l.name},
        el("td", {class: "name", text: l.name}), el("td", {class: "command", text: commandText(l.command)}),
        el("td", {class: "range", text: l.range}), el("td", {class: "chunk num", text: l.chunk}),
        el("td", {class: "gpus", text: gpuText(l)}), el("td", {class: "cores num", text: l.cores}),
        el("td", {class: "memory num", text: l.memory_bytes ? size(l.memory_bytes) : "-"}),
        el("td", {class: "tags", text: (l.tags || []).join(", ") || "-"}),
        el("td", {class: "depends", text: (l.depends || []).map((d) => `${d.layer} (${d.type})`).join(", ") || "-"}))));
    }
  }

  function merge(list) {
    for (const f of list) {
      const known = byId.get(f.id);
      if (known) Object.assign(known, f); // in place: the table and filters hold the same objects
    }
    if (panel) {
      const f = list.find((x) => x.id === panel.id);
      if (f) panel.update(f);
    }
  }

  /** Do the frames we hold add up to the job's counts? */
  function agrees() {
    const counts = {};
    for (const f of frames) counts[f.state] = (counts[f.state] || 0) + 1;
    return FRAME_STATES.every((s) => (counts[s] || 0) === (job.frame_counts[s] || 0));
  }

  async function loadAll() {
    if (loading) return loading;
    loading = (async () => {
      let all = [];
      let after = null;
      do {
        // A first small page when nothing is shown yet: 10,000 frames cost the server a
        // few hundred milliseconds, 500 a few; the table is usable while the rest loads.
        const limit = frames.length || after !== null ? PAGE : FIRST;
        const {data} = await api(`/jobs/${id}/frames?attempts=false&limit=${limit}${after === null ? "" : `&after=${after}`}`);
        if (stopped) return;
        all = all.concat(data.frames);
        after = all.length < data.total ? data.next_after : null;
        if (!frames.length) {
          // The first page on screen at once; the rest of a huge job follows.
          frames = all;
          byId = new Map(all.map((f) => [f.id, f]));
          if (job) showFrames();
        }
      } while (after !== null);
      frames = all;
      byId = new Map(all.map((f) => [f.id, f]));
      running = new Set(all.filter((f) => f.state === "RUNNING").map((f) => f.id));
      runEtag = null; // compare with a fresh RUNNING list next tick
      lastFull = Date.now();
      if (panel && byId.has(panel.id)) panel.update(byId.get(panel.id));
      if (job) showFrames();
    })();
    try {
      await loading;
    } finally {
      loading = null;
    }
  }

  async function tick() {
    try {
      const [jobRes, runRes] = await Promise.all([
        api(`/jobs/${id}`, {etag: jobEtag}),
        api(`/jobs/${id}/frames?state=RUNNING&attempts=false&limit=${PAGE}`, {etag: runEtag}),
      ]);
      if (stopped) return;
      if (jobRes.status !== 304) {
        job = jobRes.data;
        jobEtag = jobRes.etag;
        showJob();
      }
      if (runRes.status !== 304 && !loading) {
        runEtag = runRes.etag;
        const now = new Set(runRes.data.frames.map((f) => f.id));
        const left = [...running].filter((i) => !now.has(i));
        merge(runRes.data.frames);
        for (let i = 0; i < left.length; i += IDS) {
          const {data} = await api(`/jobs/${id}/frames?ids=${left.slice(i, i + IDS).join(",")}&attempts=false&limit=${PAGE}`);
          if (stopped) return;
          merge(data.frames);
        }
        running = now;
      }
      const counts = JSON.stringify(job.frame_counts);
      // The job and its RUNNING frames are two responses, each cached by the server for a
      // moment: one can be a tick newer than the other. A mismatch seen once is that skew
      // and heals next tick; only one that lasts two ticks means frames we never saw.
      const disagrees = !loading && !agrees();
      if (disagrees && disagreed && (counts === lastCounts || Date.now() - lastFull > FULL_MS)) await loadAll();
      disagreed = disagrees;
      lastCounts = counts;
      clearError("refresh");
      if (!stopped) showFrames();
    } catch (err) {
      if (!stopped) showError(err, "refresh");
    }
  }

  async function jobAction(action) {
    const path = `/jobs/${id}/${action}`;
    let body;
    if (action === "priority") {
      const value = await confirmDialog(`Set the priority of job \u201c${job.name}\u201d (#${job.id}).`,
                                        {ok: "Set priority", priority: job.priority});
      if (value === false) return;
      body = {priority: /^[+-]?\d+$/.test(value) ? Number(value) : value}; // the server explains a bad value
    } else if (JOB_CONFIRM[action]) {
      const [verb, effect] = JOB_CONFIRM[action];
      if (!(await confirmDialog(`${verb} \u201c${job.name}\u201d (#${job.id})? ${effect}`, {ok: verb}))) return;
    }
    try {
      const {data} = await api(path, {method: "POST", body});
      job = data;
      jobEtag = null;
      showJob();
      if (action === "kill" || action === "retry") await loadAll();
      ticker.now();
    } catch (err) {
      showError(err);
    }
  }

  async function frameAction(action, frame, button) {
    if (action === "log") {
      if (panel) panel.close();
      panel = framePanel(main, frame, () => {
        panel = null;
        if (button.isConnected) button.focus();
      }, label);
      return;
    }
    const [verb, effect] = FRAME_CONFIRM[action];
    if (!(await confirmDialog(`${verb} ${frame.name} of job \u201c${frame.job}\u201d? ${effect}`, {ok: verb}))) return;
    try {
      const {data} = await api(`/frames/${frame.id}/${action}`, {method: "POST"});
      merge(data.frames);
      showFrames();
      ticker.now();
    } catch (err) {
      showError(err);
    }
  }

  actions.addEventListener("click", (event) => {
    const button = event.target.closest("button[data-action]");
    if (button) jobAction(button.dataset.action);
  });
  chips.addEventListener("click", (event) => {
    const chip = event.target.closest(".chip");
    if (!chip) return;
    chip.setAttribute("aria-pressed", String(chip.getAttribute("aria-pressed") !== "true"));
    showFrames(true);
  });

  // First paint: the job and the first page of frames in parallel (rows wait for the job
  // and the caller: they say whether rows get action buttons); live ticks once all is here.
  const failed = (err) => {
    if (stopped) return;
    if (err.status === 404) {
      main.replaceChildren(el("h1", {id: "job-title", text: `No job ${id}`}), el("p", {class: "muted", text: err.detail}));
    }
    showError(err);
  };
  loadNames();
  const first = Promise.all([api(`/jobs/${id}`), ctx.ready()]).then(([res]) => {
    if (stopped) return;
    job = res.data;
    jobEtag = res.etag;
    lastCounts = JSON.stringify(job.frame_counts);
    showJob();
    if (frames.length) showFrames();
  });
  Promise.all([first, loadAll()]).then(() => {
    if (!stopped) ticker = poll(tick, TICK_MS, {now: false}); // what we hold is fresh: first tick in a second
  }, failed);

  return () => {
    stopped = true;
    if (ticker) ticker.stop();
    if (panel) panel.close();
    table.dispose();
    document.title = "cuectl";
  };
}
