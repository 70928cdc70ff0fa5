// What the jobs, frames and hosts tables share: sortable column headers, row selection
// for bulk actions, and running one action over many rows.

import {api} from "./api.js";
import {el} from "./dom.js";

/** Compare two cell values: numbers as numbers, text as text ("frame 10" after "frame 9"),
 * and an empty value (null, "-") after every other in either direction, as spreadsheets do. */
function compare(a, b, dir) {
  const none = (v) => v === null || v === undefined || v === "" || (typeof v === "number" && Number.isNaN(v));
  if (none(a) || none(b)) return none(a) === none(b) ? 0 : none(a) ? 1 : -1;
  if (typeof a === "number" && typeof b === "number") return dir * (a - b);
  return dir * String(a).localeCompare(String(b), undefined, {numeric: true, sensitivity: "base"});
}

/** Make the header cells ``ths`` sortable. ``keys[i]`` is how to read column i's value from a
 * row's data (a function), or null for a column that does not sort. A click (or Enter on
 * the header's button) sorts by that column ascending, a second click descending, a third
 * returns to the server's order. ``onChange`` runs after each change. Returns
 * {sort(list) -> a sorted copy (or the list itself when unsorted), state()}. */
export function sortable(ths, keys, onChange) {
  let by = -1;
  let dir = 1;
  const buttons = [];
  ths.forEach((th, i) => {
    if (!keys[i]) return;
    const label = th.textContent;
    const button = el("button", {type: "button", class: "sort", "data-sort": i, text: label,
                                 title: `Sort by ${label}`});
    th.replaceChildren(button);
    th.setAttribute("aria-sort", "none");
    th.classList.add("sortable");
    buttons[i] = button;
    button.addEventListener("click", () => {
      if (by !== i) [by, dir] = [i, 1];
      else if (dir === 1) dir = -1;
      else [by, dir] = [-1, 1];
      ths.forEach((other, j) => {
        if (!buttons[j]) return;
        other.setAttribute("aria-sort", j !== by ? "none" : dir === 1 ? "ascending" : "descending");
      });
      onChange();
    });
  });
  return {
    sort(list) {
      if (by < 0) return list;
      const get = keys[by];
      // Array.prototype.sort is stable: equal values keep the server's order.
      return list.map((row) => [get(row), row]).sort((x, y) => compare(x[0], y[0], dir)).map((pair) => pair[1]);
    },
  };
}

/** A bulk-action bar: "N selected", one button per action, and Clear. ``actions`` is
 * [[action, label, danger?]]; ``onAction(action)`` runs on a press. */
export function bulkBar(id, actions, onAction, onClear) {
  const count = el("span", {class: "selected-count", "aria-live": "polite"});
  const clear = el("button", {type: "button", class: "small", "data-bulk": "clear", text: "Clear selection"});
  const bar = el("div", {id, class: "bulk-bar", role: "toolbar", "aria-label": "Actions on the selected rows", hidden: true},
    count,
    actions.map(([action, label, danger]) => el("button", {type: "button", class: danger ? "danger small" : "small",
                                                         "data-bulk": action, text: label})),
    clear);
  bar.addEventListener("click", (event) => {
    const button = event.target.closest("button[data-bulk]");
    if (!button) return;
    if (button.dataset.bulk === "clear") onClear();
    else onAction(button.dataset.bulk);
  });
  let busy = false;
  return {
    element: bar,
    /** While a bulk action runs: its progress instead of the count, and no other action. */
    progress(text) {
      busy = text !== null;
      if (!busy) return;
      count.textContent = text;
      for (const button of bar.querySelectorAll("button[data-bulk]")) button.disabled = true;
    },
    /** Show ``n`` selected (hidden at none); ``enabled(action)`` says which buttons apply. */
    update(n, noun, enabled = () => true) {
      if (busy) return; // the bar shows the action's progress until it ends
      bar.hidden = n === 0;
      count.textContent = `${n} ${noun}${n === 1 ? "" : "s"} selected`;
      for (const button of bar.querySelectorAll("button[data-bulk]")) {
        if (button.dataset.bulk !== "clear") button.disabled = !enabled(button.dataset.bulk);
      }
    },
  };
}

/** POST ``paths`` (each a separate request of the public API, so the server applies the
 * owner and admin rules to each) a few at a time. Resolves to {done: [answers], failed:
 * [[path, ApiError]]}; one refusal does not stop the others. */
export async function postAll(paths, {parallel = 4, onProgress = () => {}} = {}) {
  const done = [];
  const failed = [];
  let next = 0;
  async function lane() {
    while (next < paths.length) {
      const path = paths[next++];
      try {
        done.push((await api(path, {method: "POST"})).data);
      } catch (err) {
        failed.push([path, err]);
      }
      onProgress(done.length + failed.length, paths.length);
    }
  }
  await Promise.all(Array.from({length: Math.min(parallel, paths.length)}, lane));
  return {done, failed};
}

/** One line for the banner when some of a bulk action was refused: how many, and why (the
 * first few distinct reasons). */
export function bulkFailure(verb, total, failed, noun) {
  const reasons = [...new Set(failed.map(([, err]) => err.detail || err.message))].slice(0, 3).join("; ");
  const error = new Error(`${verb}: ${failed.length} of ${total} ${noun}${total === 1 ? "" : "s"} refused: ${reasons}`);
  error.title = "";
  return error;
}
