// DOM helpers and formatters shared by the pages.
//
// The one rule: data from the API (job names, commands, env values, host names, logs) is
// hostile input. It only ever enters the page as text (textContent, Text nodes via
// append) or as attribute values; nothing here or elsewhere assigns innerHTML.

/** el("td", {class: "name", "data-x": 1}, child, "text", ...) -> a new element.
 * Keys: class, text (textContent), on<event> (listener), DOM properties given a non-string
 * value (hidden: true, disabled: false), any other key an attribute. Strings among the
 * children become Text nodes. */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on") && typeof value === "function") node.addEventListener(key.slice(2), value);
    else if (typeof value === "boolean") node[key] = value;
    else node.setAttribute(key, String(value));
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined && child !== false) node.append(child);
  }
  return node;
}

/** Set an element's text only when it differs (keeps live updates from touching the DOM). */
export function setText(node, text) {
  const value = String(text);
  if (node.textContent !== value) node.textContent = value;
}

export const FRAME_STATES = ["SUCCEEDED", "RUNNING", "WAITING", "DEPEND", "DEAD", "EATEN"];
const GIB = 1024 ** 3;

/** Bytes as "GB" with one decimal. GB here is 2^30 bytes, like the job spec's "24G": a
 * "24 GB" card reporting 24564 MiB shows as 24.0. */
export function gb(bytes) {
  return bytes === null || bytes === undefined ? "-" : (bytes / GIB).toFixed(1);
}

/** A memory request as the spec writes it: 16G, 500M. */
export function size(bytes) {
  if (!bytes) return "0";
  if (bytes % GIB === 0) return `${bytes / GIB}G`;
  return `${Math.round(bytes / 1024 ** 2)}M`;
}

export function pct(value) {
  return value === null || value === undefined ? "-" : String(Math.round(value));
}

/** A device's utilisation as "37%"; when its last sample is too old to be current (the API
 * then gives null and the sample's age), how old it is, as `cuectl top` says: "25s ago". */
export function utilText(device) {
  if (!device) return "-";
  if (device.utilization_pct !== null && device.utilization_pct !== undefined) return `${pct(device.utilization_pct)}%`;
  if (device.sample_age_s !== null && device.sample_age_s !== undefined) return `${duration(device.sample_age_s)} ago`;
  return "-";
}

/** Seconds as the CLI prints them: 42s, 3m07s, 2h05m. */
export function duration(seconds) {
  if (seconds === null || seconds === undefined || !isFinite(seconds)) return "-";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
  return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
}

/** How long a frame ran (or has been running: the server's clock may differ a little from
 * ours, hence the clamp at zero in duration()). */
export function runtime(frame, now = Date.now()) {
  if (!frame.started_at) return "-";
  const start = Date.parse(frame.started_at);
  const end = frame.ended_at ? Date.parse(frame.ended_at) : frame.state === "RUNNING" ? now : null;
  return end === null ? "-" : duration((end - start) / 1000);
}

export function localTime(iso) {
  return iso ? new Date(iso).toLocaleString() : "-";
}

/** A command for display: argv words quoted where a shell would need it. */
export function commandText(command) {
  if (!Array.isArray(command)) return String(command ?? "");
  return command.map((w) => (/^[\w@%+=:,./#-]+$/.test(w) ? w : `'${String(w).replace(/'/g, `'"'"'`)}'`)).join(" ");
}

/** Split one command line into argv like a POSIX shell does for words: whitespace
 * separates, '…' is literal, "…" allows \" \\ \$ \`, a backslash outside quotes escapes
 * the next character. No expansion of any kind. Throws on an unclosed quote. */
export function shellSplit(line) {
  const words = [];
  let word = null; // null: between words (so "" and '' still make an empty word)
  for (let i = 0; i < line.length; i++) {
    const c = line[i];
    if (c === "'") {
      const end = line.indexOf("'", i + 1);
      if (end < 0) throw new Error("unclosed single quote");
      word = (word ?? "") + line.slice(i + 1, end);
      i = end;
    } else if (c === '"') {
      let j = i + 1;
      word = word ?? "";
      for (; j < line.length && line[j] !== '"'; j++) {
        if (line[j] === "\\" && '"\\$`'.includes(line[j + 1] ?? "")) j++;
        word += line[j];
      }
      if (j >= line.length) throw new Error("unclosed double quote");
      i = j;
    } else if (c === "\\") {
      if (i + 1 < line.length) word = (word ?? "") + line[++i];
    } else if (/\s/.test(c)) {
      if (word !== null) words.push(word);
      word = null;
    } else {
      word = (word ?? "") + c;
    }
  }
  if (word !== null) words.push(word);
  return words;
}

/** Frame counts as a bar of proportional segments plus "done/total" (done: SUCCEEDED and
 * EATEN, as `cuectl job list` counts them). Every state has a segment (zero-width when
 * none), so live updates change widths in place. */
export function progressBar() {
  const bar = el("span", {class: "bar"}, FRAME_STATES.map((s) => el("span", {class: "seg", "data-state": s})));
  return el("span", {class: "progress-box", role: "img"}, bar, el("span", {class: "done"}));
}

export function updateProgress(box, counts) {
  const total = FRAME_STATES.reduce((n, s) => n + (counts[s] || 0), 0);
  for (const seg of box.querySelectorAll(".seg")) {
    const n = counts[seg.dataset.state] || 0;
    seg.style.width = total ? `${(100 * n) / total}%` : "0%";
    seg.title = `${seg.dataset.state}: ${n}`;
  }
  const done = (counts.SUCCEEDED || 0) + (counts.EATEN || 0);
  setText(box.querySelector(".done"), `${done}/${total}`);
  const parts = FRAME_STATES.filter((s) => counts[s]).map((s) => `${counts[s]} ${s}`);
  box.setAttribute("aria-label", `${done} of ${total} done${parts.length ? ": " + parts.join(", ") : ""}`);
}
