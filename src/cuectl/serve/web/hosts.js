// #/hosts: every GPU of every host with its live utilisation and memory and who holds it,
// filtered by the server (GET /hosts?vendor=&model=&gpu_memory_min=, the scheduler's own
// matching rules), refreshed each second.

import {api, poll} from "./api.js";
import {el, gb, pct} from "./dom.js";
import {clearError, showError} from "./ui.js";

const TICK_MS = 1000;

function holderText(holder) {
  if (!holder) return "-";
  if (holder.kind === "foreign") return "foreign";
  return holder.label || holder.kind;
}

export function hostsPage(main) {
  const vendor = el("select", {id: "filter-vendor"},
    el("option", {value: "", text: "any"}), ["NVIDIA", "AMD", "Apple", "Intel"].map((v) => el("option", {value: v, text: v})));
  const model = el("input", {id: "filter-model", type: "search", placeholder: "A100, *4090*", autocomplete: "off"});
  const memory = el("input", {id: "filter-memory", type: "text", placeholder: "24G", autocomplete: "off", size: 6});
  const summary = el("span", {class: "muted count", "aria-live": "polite"});
  const tbody = el("tbody");
  const empty = el("p", {class: "muted empty", hidden: true});
  main.append(
    el("div", {class: "toolbar"}, el("h1", {text: "Hosts"}),
      el("label", {}, "Vendor ", vendor), el("label", {}, "Model ", model), el("label", {}, "Min memory ", memory), summary),
    el("div", {class: "table-wrap"}, el("table", {id: "hosts-table"},
      el("thead", {}, el("tr", {}, ["Host", "GPU", "Util", "Memory", "Holder", "Model", "State"] // live values first (a phone shows those)
        .map((h, i) => el("th", {scope: "col", class: [1, 2, 3].includes(i) ? "num" : null, text: h})))), tbody)),
    empty);

  let etag = null;
  let stopped = false;

  function render(hosts) {
    const rows = [];
    let gpus = 0;
    let held = 0;
    for (const host of hosts) {
      const state = host.state + (host.locked ? " \u00b7 locked" : "");
      const devices = host.devices.length ? host.devices : [null]; // a host with no GPU: one row
      for (const d of devices) {
        const used = d && d.memory_used_bytes;
        const total = d && d.memory_total_bytes;
        const bar = el("span", {class: "meter", "aria-hidden": "true"}, el("span"));
        if (d && d.utilization_pct !== null) bar.firstChild.style.width = `${Math.min(100, d.utilization_pct)}%`;
        const tr = el("tr", {"data-host": host.name, "data-gpu-uuid": d ? d.uuid || "" : "", "data-state": host.state},
          el("td", {class: "host", text: host.name}),
          el("td", {class: "index num", text: d ? d.index ?? "-" : "-"}),
          el("td", {class: "util num"}, d && d.utilization_pct !== null ? `${pct(d.utilization_pct)}%` : "-", d ? bar : null),
          el("td", {class: "mem num", text: d ? `${gb(used)} / ${gb(total)} GB` : "-"}),
          el("td", {class: "holder", text: d ? holderText(d.holder) : "-",
                    "data-kind": d && d.holder ? d.holder.kind : null,
                    title: d && d.holder ? [d.holder.kind, d.holder.user, d.holder.pid && `pid ${d.holder.pid}`].filter(Boolean).join(" ") : null}),
          el("td", {class: "model", text: d ? d.model || "-" : "no GPUs"}),
          el("td", {class: "state", text: state}));
        if (d) gpus++;
        if (d && d.holder) held++;
        rows.push(tr);
      }
    }
    tbody.replaceChildren(...rows);
    const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;
    summary.textContent = `${plural(hosts.length, "host")} \u00b7 ${plural(gpus, "GPU")} \u00b7 ${held} held`;
    empty.hidden = rows.length > 0;
    empty.textContent = vendor.value || model.value || memory.value ? "No GPU matches the filters." : "No hosts have registered yet (start a worker).";
  }

  async function refresh() {
    const query = new URLSearchParams();
    if (vendor.value) query.set("vendor", vendor.value);
    if (model.value.trim()) query.set("model", model.value.trim());
    if (memory.value.trim()) query.set("gpu_memory_min", memory.value.trim());
    try {
      const res = await api(`/hosts?${query}`, {etag});
      if (stopped) return;
      memory.removeAttribute("aria-invalid");
      clearError("refresh");
      clearError("filter");
      if (res.status === 304) return;
      etag = res.etag;
      render(res.data.hosts);
    } catch (err) {
      if (stopped) return;
      if (err.field === "gpu_memory_min") memory.setAttribute("aria-invalid", "true");
      showError(err, err.status === 422 ? "filter" : "refresh");
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
