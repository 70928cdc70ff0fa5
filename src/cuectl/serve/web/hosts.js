// #/hosts: every GPU of every host with its live utilisation and memory and who holds it,
// filtered by the server (GET /hosts?vendor=&model=&gpu_memory_min=, the scheduler's own
// matching rules), refreshed each second; columns sort on a click. A filter the server
// refuses is explained beside its field, and the table is emptied rather than left showing
// rows the filter no longer describes.

import {api, poll} from "./api.js";
import {el, gb, utilText} from "./dom.js";
import {sortable} from "./table.js";
import {clearError, showError} from "./ui.js";

const TICK_MS = 1000;

/** A model as people say it: without the vendor's name ("NVIDIA A100-SXM4-80GB" -> "A100-SXM4-80GB"). */
export function shortModel(model) {
  return String(model || "").replace(/^(NVIDIA|AMD|Intel|Apple)\s+/i, "") || "unknown model";
}

/** GPU uuid -> {host, index, model} from GET /hosts' answer. */
export function deviceNames(hosts) {
  const names = new Map();
  for (const host of hosts) for (const d of host.devices) if (d.uuid) names.set(d.uuid, {host: host.name, index: d.index, model: d.model});
  return names;
}

/** Devices by uuid as a person reads them: "render-01 gpu 1 (A100-SXM4-80GB)"; several of
 * one model "render-01 gpu 0,1 (A100-SXM4-80GB)". A uuid no host lists any more (its host
 * forgotten) is shown as it is. -> {text, title} (the title adds the full model and uuids). */
export function gpuLabel(uuids, names, frameHost = null) {
  if (!uuids || !uuids.length) return {text: "-", title: ""};
  const groups = new Map(); // "host|model" -> indices
  const unknown = [];
  for (const uuid of uuids) {
    const d = names.get(uuid);
    if (!d) {
      unknown.push(uuid);
      continue;
    }
    const key = `${d.host}\u0000${d.model || ""}`;
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(d.index ?? "?");
  }
  const parts = [...groups].map(([key, indices]) => {
    const [host, model] = key.split("\u0000");
    return `${host} gpu ${indices.join(",")} (${shortModel(model)})`;
  });
  const text = [...parts, ...unknown.map((u) => (frameHost ? `${frameHost} ${u}` : u))].join(", ");
  const title = uuids.map((u) => {
    const d = names.get(u);
    return d ? `${d.host} gpu ${d.index} (${d.model}) ${u}` : u;
  }).join("\n");
  return {text, title};
}

function holderText(holder) {
  if (!holder) return "-";
  if (holder.kind === "foreign") return "foreign";
  return holder.label || holder.kind;
}

export function hostsPage(main) {
  const vendor = el("select", {id: "filter-vendor"},
    el("option", {value: "", text: "any"}), ["NVIDIA", "AMD", "Apple", "Intel"].map((v) => el("option", {value: v, text: v})));
  const model = el("input", {id: "filter-model", type: "search", placeholder: "A100, *4090*", autocomplete: "off",
                             "aria-describedby": "filter-model-error"});
  const memory = el("input", {id: "filter-memory", type: "text", placeholder: "24G", autocomplete: "off", size: 6,
                              "aria-describedby": "filter-memory-error"});
  // Where the server's objection to a filter value is shown: beside that field.
  const fields = {vendor, model, gpu_memory_min: memory};
  const errors = {
    vendor: el("span", {id: "filter-vendor-error", class: "field-error", role: "alert"}),
    model: el("span", {id: "filter-model-error", class: "field-error", role: "alert"}),
    gpu_memory_min: el("span", {id: "filter-memory-error", class: "field-error", role: "alert"}),
  };
  vendor.setAttribute("aria-describedby", "filter-vendor-error");
  const summary = el("span", {class: "muted count", "aria-live": "polite"});
  const tbody = el("tbody");
  const empty = el("p", {class: "muted empty", hidden: true});
  const ths = ["Host", "GPU", "Util", "Memory", "Holder", "Model", "State"] // live values first (a phone shows those)
    .map((h, i) => el("th", {scope: "col", class: ["host", "index num", "util num", "mem num", "holder", "model", "state"][i], text: h}));
  main.append(
    el("div", {class: "toolbar"}, el("h1", {text: "Hosts"}),
      el("span", {class: "filter"}, el("label", {}, "Vendor ", vendor), errors.vendor),
      el("span", {class: "filter"}, el("label", {}, "Model ", model), errors.model),
      el("span", {class: "filter"}, el("label", {}, "Min memory ", memory), errors.gpu_memory_min), summary),
    el("div", {class: "table-wrap"}, el("table", {id: "hosts-table", class: "fixed"},
      el("thead", {}, el("tr", {}, ths)), tbody)),
    empty);

  let etag = null;
  let stopped = false;
  let hosts = [];
  const sorter = sortable(ths, [({host}) => host.name, ({d}) => (d ? d.index : null), ({d}) => (d ? d.utilization_pct : null),
    ({d}) => (d ? d.memory_used_bytes : null), ({d}) => (d ? holderText(d.holder) : null), ({d}) => (d ? d.model : null),
    ({host}) => host.state + (host.locked ? " locked" : "")], () => render());

  function render() {
    const rows = [];
    let gpus = 0;
    let held = 0;
    const items = [];
    for (const host of hosts) {
      const devices = host.devices.length ? host.devices : [null]; // a host with no GPU: one row
      for (const d of devices) items.push({host, d});
    }
    for (const {host, d} of sorter.sort(items)) {
      // A device out of service says so, and why (docs/gpu-health.md): "drained: Xid 79: ...".
      const out = d && d.state && d.state !== "ok" ? ` \u00b7 gpu ${d.state}: ${d.reason || "no reason given"}` : "";
      const state = host.state + (host.locked ? " \u00b7 locked" : "") + out;
      const used = d && d.memory_used_bytes;
      const total = d && d.memory_total_bytes;
      const bar = el("span", {class: "meter", "aria-hidden": "true"}, el("span"));
      if (d && d.utilization_pct !== null) bar.firstChild.style.width = `${Math.min(100, d.utilization_pct)}%`;
      const holder = d ? holderText(d.holder) : "-";
      const tr = el("tr", {"data-host": host.name, "data-gpu-uuid": d ? d.uuid || "" : "", "data-state": host.state,
                           "data-device-state": d ? d.state || "ok" : null},
        el("td", {class: "host", title: host.name}, el("a", {href: `#/hosts/${encodeURIComponent(host.name)}`, text: host.name})),
        el("td", {class: "index num", text: d ? d.index ?? "-" : "-"}),
        el("td", {class: "util num", title: d && d.sampled_at ? `sampled ${d.sampled_at}` : null}, utilText(d), d ? bar : null),
        el("td", {class: "mem num", text: d ? `${gb(used)} / ${gb(total)} GB` : "-"}),
        el("td", {class: "holder", text: holder,
                  "data-kind": d && d.holder ? d.holder.kind : null,
                  title: d && d.holder ? [holder, d.holder.kind, d.holder.user, d.holder.pid && `pid ${d.holder.pid}`].filter(Boolean).join(" ") : null}),
        el("td", {class: "model", text: d ? d.model || "-" : "no GPUs", title: d ? d.model || null : null}),
        el("td", {class: "state", text: state}));
      if (d) gpus++;
      if (d && d.holder) held++;
      rows.push(tr);
    }
    tbody.replaceChildren(...rows);
    const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;
    summary.textContent = `${plural(hosts.length, "host")} \u00b7 ${plural(gpus, "GPU")} \u00b7 ${held} held`;
    empty.hidden = rows.length > 0;
    empty.textContent = vendor.value || model.value || memory.value ? "No GPU matches the filters." : "No hosts have registered yet (start a worker).";
  }

  function fieldErrors(err) {
    for (const [name, box] of Object.entries(errors)) {
      const wrong = !!err && (err.field === name || (err.field === null && name === "gpu_memory_min" && memory.value.trim() !== ""));
      box.textContent = wrong ? err.detail || err.message : "";
      if (wrong) fields[name].setAttribute("aria-invalid", "true");
      else fields[name].removeAttribute("aria-invalid");
    }
  }

  async function refresh() {
    const query = new URLSearchParams();
    if (vendor.value) query.set("vendor", vendor.value);
    if (model.value.trim()) query.set("model", model.value.trim());
    if (memory.value.trim()) query.set("gpu_memory_min", memory.value.trim());
    try {
      const res = await api(`/hosts?${query}`, {etag});
      if (stopped) return;
      fieldErrors(null);
      clearError("refresh");
      if (res.status === 304) return;
      etag = res.etag;
      hosts = res.data.hosts;
      render();
    } catch (err) {
      if (stopped) return;
      if (err.status === 400 || err.status === 422) {
        // A filter the server refuses: say so beside the field, and show no rows rather
        // than the last filter's (they would read as the answer to this one).
        fieldErrors(err);
        if (!Object.values(errors).some((box) => box.textContent)) showError(err, "refresh");
        etag = null;
        hosts = [];
        tbody.replaceChildren();
        summary.textContent = "";
        empty.hidden = false;
        empty.textContent = "No rows: a filter value is not valid.";
      } else {
        showError(err, "refresh");
      }
    }
  }

  let debounce = null;
  const changed = () => {
    clearTimeout(debounce);
    debounce = setTimeout(() => {
      etag = null;
      ticker.now();
    }, 250);
  };
  vendor.addEventListener("change", changed);
  model.addEventListener("input", changed);
  memory.addEventListener("input", changed);
  const ticker = poll(refresh, TICK_MS);
  return () => {
    stopped = true;
    clearTimeout(debounce);
    ticker.stop();
  };
}
