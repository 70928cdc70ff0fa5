// The frame panel of a job page: a frame's facts, its GPU use over time (chart.js) and its
// log, followed live while the frame runs (GET .../log?follow=true streams until it ends).

import {api, poll, streamText} from "./api.js";
import {drawUsage} from "./chart.js";
import {duration, el, gb, pct, runtime, setText} from "./dom.js";
import {showError} from "./ui.js";

const TAIL_LINES = 5000;       // a log may be gigabytes: show its end
const MAX_CHARS = 4_000_000;   // and keep at most this much of a followed log in the page
const USAGE_MS = 2000;         // the worker samples every few seconds; no need to ask more often
const ANSI = /\x1b\[[0-9;?]*[ -/]*[@-~]/g; // colour codes: noise in a <pre>

/** Open the panel for ``frame`` in ``host`` (an element); ``onClose`` runs after it closes;
 * ``gpuLabel(frame)`` -> {text, title} names its devices ("render-01 gpu 1 (A100)"). */
export function framePanel(host, frame, onClose, gpuLabel = (f) => ({text: (f.gpu_uuids || []).join(", ") || "-", title: ""})) {
  const close = el("button", {id: "frame-panel-close", type: "button", class: "icon", text: "\u00d7",
                              "aria-label": "Close the frame panel"});
  const state = el("span", {class: "badge state"});
  const facts = el("dl", {class: "facts"});
  const canvas = el("canvas", {id: "usage-chart", role: "img", "aria-label": "GPU use over time"},
                    "GPU utilisation and memory over time");
  const logStatus = el("span", {class: "muted"});
  const log = el("pre", {id: "log-view", tabindex: 0, "aria-label": `Log of frame ${frame.name}`});
  const attempts = el("tbody");
  const events = el("tbody");
  const eventsBox = el("details", {class: "gpu-events", id: "gpu-events", hidden: true, open: true},
    el("summary", {text: "GPU events"}),
    el("div", {class: "table-wrap"}, el("table", {},
      el("thead", {}, el("tr", {}, ["#", "At", "Event", "GPU", "PID", "Detail"].map((t) => el("th", {scope: "col", text: t})))),
      events)));
  const panel = el("aside", {id: "frame-panel", "aria-labelledby": "frame-panel-title"},
    el("div", {class: "panel-head"},
       el("h2", {id: "frame-panel-title", text: `${frame.job} / ${frame.name}`}), state, close),
    facts,
    el("h3", {text: "GPU use"}),
    canvas,
    el("p", {class: "legend"}, el("span", {class: "key util"}), "utilisation %  ", el("span", {class: "key mem"}),
       "memory (GB)"),
    el("details", {class: "attempts"}, el("summary", {text: "Attempts"}),
       el("div", {class: "table-wrap"}, el("table", {},
         el("thead", {}, el("tr", {}, ["#", "Host", "Outcome", "Exit", "Util % mean", "Mem peak (GB)", "Runtime"]
           .map((t) => el("th", {scope: "col", text: t})))), attempts))),
    eventsBox,
    el("div", {class: "log-head"}, el("h3", {text: "Log"}), logStatus),
    log);
  host.append(panel);
  close.focus();

  let current = frame;
  let samples = {};
  let stream = null;       // AbortController of the log request
  let usage = null;        // poll() of GET /frames/{id} while it runs
  let closed = false;

  function showFacts(f) {
    const items = [["Host", f.host || "-"], ["Attempts", f.attempts], ["Runtime", runtime(f)],
      ["GPU util %", pct(f.state === "RUNNING" ? f.gpu_util_pct : f.gpu_util_mean_pct)],
      ["GPU mem (GB)", gb(f.state === "RUNNING" ? f.gpu_memory_used_bytes : f.gpu_memory_peak_bytes)],
      ["GPUs", gpuLabel(f)]];
    facts.replaceChildren(...items.map(([k, v]) => el("div", {}, el("dt", {text: k}),
      el("dd", typeof v === "object" ? {text: v.text, title: v.title} : {text: v}))));
    setText(state, f.state);
    state.dataset.state = f.state;
  }

  function chart() {
    canvas.setAttribute("aria-label", `GPU use over time: ${drawUsage(canvas, samples, current.gpu_uuids || [])}`);
  }

  async function loadUsage() {
    try {
      const {data} = await api(`/frames/${frame.id}`);
      if (closed) return;
      samples = data.samples || {};
      current = {...current, ...data};
      chart();
      attempts.replaceChildren(...(data.attempt_history || []).map((a) => el("tr", {},
        el("td", {text: a.attempt}), el("td", {text: a.host || "-"}), el("td", {text: a.outcome || "-"}),
        el("td", {text: a.exit_code ?? (a.exit_signal ? `sig ${a.exit_signal}` : "-")}),
        el("td", {text: pct(a.gpu_util_mean_pct)}), el("td", {text: gb(a.gpu_memory_peak_bytes)}),
        el("td", {text: duration(a.started_at && a.ended_at ? (Date.parse(a.ended_at) - Date.parse(a.started_at)) / 1000 : null)}))));
      // What the worker saw on the devices: escapes, foreign processes, idle devices, ...
      const seen = data.gpu_events || [];
      events.replaceChildren(...seen.map((e) => el("tr", {"data-kind": e.kind},
        el("td", {text: e.attempt ?? "-"}), el("td", {text: e.at || "-"}), el("td", {class: "kind", text: e.kind}),
        el("td", {text: e.device_index ?? e.device ?? "-"}), el("td", {text: e.pid ?? "-"}),
        el("td", {class: "detail", text: e.detail || ""}))));
      eventsBox.hidden = seen.length === 0;
      if (data.state !== "RUNNING" && usage) {
        usage.stop();
        usage = null;
      }
    } catch (err) {
      if (!closed) showError(err);
    }
  }

  let size = 0;
  function append(text) {
    const clean = text.replace(ANSI, "");
    const atEnd = log.scrollHeight - log.scrollTop - log.clientHeight < 32;
    log.append(clean); // a Text node: a log is never parsed as HTML
    size += clean.length;
    if (size > MAX_CHARS) {
      log.textContent = log.textContent.slice(-MAX_CHARS / 2);
      size = log.textContent.length;
    }
    if (atEnd) log.scrollTop = log.scrollHeight;
  }

  async function loadLog() {
    if (stream) stream.abort();
    stream = new AbortController();
    const follow = current.state === "RUNNING";
    log.textContent = "";
    size = 0;
    setText(logStatus, follow ? "following the running frame\u2026" : `last ${TAIL_LINES} lines`);
    try {
      await streamText(`/frames/${frame.id}/log?tail=${TAIL_LINES}${follow ? "&follow=true" : ""}`, append, stream.signal);
      if (follow && !closed) setText(logStatus, "the frame has ended");
    } catch (err) {
      if (err.name === "AbortError" || closed) return;
      if (err.status === 404) {
        // Not an error of the page: the frame has not run yet, or its log is on the worker.
        setText(logStatus, "");
        log.textContent = err.detail + (err.hint ? ` (${err.hint})` : "");
      } else {
        showError(err);
      }
    }
  }

  function start() {
    loadLog();
    if (usage) usage.stop();
    usage = current.state === "RUNNING" ? poll(loadUsage, USAGE_MS) : null;
    if (!usage) loadUsage();
  }

  showFacts(frame);
  chart();
  start();
  const resize = () => chart();
  window.addEventListener("resize", resize);

  const handle = {
    id: frame.id,
    /** The job page's newer copy of the frame (each live tick). */
    update(f) {
      const wasRunning = current.state === "RUNNING";
      current = {...current, ...f};
      showFacts(current);
      if (!wasRunning && f.state === "RUNNING") start(); // it started: follow it now
    },
    close() {
      if (closed) return;
      closed = true;
      if (stream) stream.abort();
      if (usage) usage.stop();
      window.removeEventListener("resize", resize);
      panel.remove();
      onClose();
    },
  };
  close.addEventListener("click", handle.close);
  return handle;
}
