// #/hosts/<name>: one host: its facts, its devices with live use and who holds each, its
// RUNNING frames, and (admins) Lock / Unlock. One request a second, GET /hosts/{name} with
// its ETag (a 304 while nothing changed).

import {api, poll} from "./api.js";
import {el, gb, localTime, pct, runtime, setText, utilText} from "./dom.js";
import {deviceNames, gpuLabel} from "./hosts.js";
import {clearError, confirmDialog, showError} from "./ui.js";

const TICK_MS = 1000;

/** A host name from the address bar: a malformed escape (#/hosts/%E0) is taken as typed,
 * not left to throw and blank the page. */
function hostName(text) {
  try {
    return decodeURIComponent(text);
  } catch {
    return text;
  }
}

export function hostPage(main, ctx, nameText) {
  const name = hostName(nameText);
  const title = el("h1", {id: "host-title", text: name});
  const state = el("span", {id: "host-state", class: "badge state"});
  const actions = el("div", {id: "host-actions", class: "actions"});
  const meta = el("p", {class: "muted job-meta", id: "host-meta"});
  const gpus = el("tbody");
  const frames = el("tbody");
  const procs = el("tbody");
  const noProcs = el("p", {class: "muted empty", text: "No process is on its GPUs.", hidden: true});
  const noFrames = el("p", {class: "muted empty", text: "No frame is running here.", hidden: true});
  const head = (labels, classes) => el("thead", {}, el("tr", {}, labels.map((h, i) => el("th", {scope: "col", class: classes[i], text: h}))));
  main.append(
    el("p", {class: "crumbs"}, el("a", {href: "#/hosts", text: "Hosts"}), " / ", name),
    el("div", {class: "toolbar"}, title, state, actions),
    meta,
    el("h2", {text: "GPUs"}),
    el("div", {class: "table-wrap"}, el("table", {id: "host-gpus", class: "fixed"},
      head(["GPU", "Model", "Util", "Memory", "Holder"], ["index num", "model", "util num", "mem num", "holder"]), gpus)),
    el("h2", {text: "GPU processes"}),
    el("div", {class: "table-wrap"}, el("table", {id: "host-procs", class: "fixed"},
      head(["GPU", "PID", "User", "Memory (GB)", "Owner"], ["index num", "pid num", "user", "mem num", "owner"]), procs)),
    noProcs,
    el("h2", {text: "Running frames"}),
    el("div", {class: "table-wrap"}, el("table", {id: "host-frames", class: "fixed"},
      head(["Job", "Frame", "GPU", "GPU Util %", "GPU Mem (GB)", "Runtime"],
           ["job", "frame", "gpu", "gpu-util num", "gpu-mem num", "runtime num"]), frames)),
    noFrames);

  let host = null;
  let etag = null;
  let stopped = false;

  function show() {
    document.title = `${host.name} \u00b7 cuectl`;
    setText(state, host.state + (host.locked ? " \u00b7 locked" : ""));
    state.dataset.state = host.state;
    state.toggleAttribute("data-locked", host.locked);
    setText(meta, [`${host.cores} cores`, `${gb(host.memory_bytes)} GB memory`,
      host.tags && host.tags.length ? `tags ${host.tags.join(", ")}` : null,
      host.version ? `cuectl ${host.version}` : null, host.worker_pid ? `worker pid ${host.worker_pid}` : null,
      `last heartbeat ${localTime(host.last_heartbeat)}`].filter(Boolean).join(" \u00b7 "));
    if (ctx.me && ctx.me.role === "admin" && !actions.children.length) {
      actions.append(el("button", {type: "button", "data-action": "lock", text: "Lock"}),
                     el("button", {type: "button", "data-action": "unlock", text: "Unlock"}));
    }
    if (actions.children.length) {
      actions.querySelector('[data-action="lock"]').hidden = host.locked;
      actions.querySelector('[data-action="unlock"]').hidden = !host.locked;
    }
    const names = deviceNames([host]);
    const jobOf = new Map(host.running_frames.map((f) => [f.id, f]));
    gpus.replaceChildren(...(host.devices.length ? host.devices.map((d) => {
      const bar = el("span", {class: "meter", "aria-hidden": "true"}, el("span"));
      if (d.utilization_pct !== null) bar.firstChild.style.width = `${Math.min(100, d.utilization_pct)}%`;
      const h = d.holder;
      const frame = h && h.kind === "frame" ? jobOf.get(h.frame_id) : null;
      let holder = (!h ? "-" : h.kind === "foreign" ? "foreign" : h.label || h.kind) + (d.held_idle ? " (held idle)" : "");
      if (d.state && d.state !== "ok") holder = `${d.state}: ${d.reason || "no reason given"}`; // out of service, and why
      return el("tr", {"data-gpu-uuid": d.uuid || "", "data-device-state": d.state || "ok"},
        el("td", {class: "index num", text: d.index ?? "-"}),
        el("td", {class: "model", text: d.model || "-", title: `${d.model || ""} ${d.uuid || ""}`.trim()}),
        el("td", {class: "util num", title: d.sampled_at ? `sampled ${d.sampled_at}` : null}, utilText(d), bar),
        el("td", {class: "mem num", text: `${gb(d.memory_used_bytes)} / ${gb(d.memory_total_bytes)} GB`}),
        el("td", {class: "holder", "data-kind": h ? h.kind : null, title: h ? [h.kind, h.user, h.pid && `pid ${h.pid}`].filter(Boolean).join(" ") : null},
          frame ? el("a", {href: `#/jobs/${frame.job_id}`, text: holder}) : holder));
    }) : [el("tr", {}, el("td", {colspan: 5, class: "muted", text: "no GPUs"}))]));
    // Whose each process on a GPU is (docs/gpu-health.md): a frame, a lease, or nobody's.
    const rows = host.devices.flatMap((d) => (d.processes || []).map((p) => ({d, p})));
    procs.replaceChildren(...rows.map(({d, p}) => el("tr", {"data-pid": p.pid, "data-owner": p.owner},
      el("td", {class: "index num", text: d.index ?? "-"}),
      el("td", {class: "pid num", text: p.pid}),
      el("td", {class: "user", text: p.user || "?"}),
      el("td", {class: "mem num", text: gb(p.memory_bytes)}),
      el("td", {class: "owner", text: p.owner === "foreign" ? "foreign (not run by cuectl)" : p.holder || p.owner}))));
    noProcs.hidden = rows.length > 0;
    const now = Date.now();
    frames.replaceChildren(...host.running_frames.map((f) => {
      const gpu = gpuLabel(f.gpu_uuids, names, f.host);
      return el("tr", {"data-frame-id": f.id},
        el("td", {class: "job", title: f.job}, el("a", {href: `#/jobs/${f.job_id}`, text: f.job})),
        el("td", {class: "frame", text: f.name}),
        el("td", {class: "gpu", text: gpu.text.replace(`${host.name} `, ""), title: gpu.title}),
        el("td", {class: "gpu-util num", text: pct(f.gpu_util_pct)}),
        el("td", {class: "gpu-mem num", text: gb(f.gpu_memory_used_bytes)}),
        el("td", {class: "runtime num", text: runtime(f, now)}));
    }));
    noFrames.hidden = host.running_frames.length > 0;
  }

  async function refresh() {
    try {
      const res = await api(`/hosts/${encodeURIComponent(name)}`, {etag});
      if (stopped) return;
      clearError("refresh");
      if (res.status === 304) return;
      etag = res.etag;
      host = res.data;
      await ctx.ready();
      if (!stopped) show();
    } catch (err) {
      if (stopped) return;
      if (err.status === 404) {
        ticker.stop();
        main.replaceChildren(el("h1", {id: "host-title", text: `No host ${name}`}), el("p", {class: "muted", text: err.detail}));
      }
      showError(err, err.status === 404 ? "action" : "refresh");
    }
  }

  actions.addEventListener("click", async (event) => {
    const button = event.target.closest("button[data-action]");
    if (!button) return;
    const action = button.dataset.action;
    const text = action === "lock"
      ? `Lock host ${name}? No new frames are sent to it; the frames running there finish.`
      : `Unlock host ${name}? It takes new frames again.`;
    if (!(await confirmDialog(text, {ok: action === "lock" ? "Lock" : "Unlock"}))) return;
    try {
      host = (await api(`/hosts/${encodeURIComponent(name)}/${action}`, {method: "POST"})).data;
      etag = null;
      if (!stopped) show();
    } catch (err) {
      showError(err);
    }
  });

  const ticker = poll(refresh, TICK_MS);
  return () => {
    stopped = true;
    ticker.stop();
    document.title = "cuectl";
  };
}
