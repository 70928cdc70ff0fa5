// #/submit: a one-layer job, posted as the job spec JSON (docs/job-spec.md). The server
// validates everything; its problem's ``field`` (layers[0].gpus, name, ...) puts the
// message beside the input it is about.

import {api} from "./api.js";
import {el, shellSplit} from "./dom.js";

// [input name, label, attributes, help]
const FIELDS = [
  ["name", "Job name", {required: true, autocomplete: "off"}, null],
  ["priority", "Priority", {inputmode: "numeric", placeholder: "0"}, "higher runs first"],
  ["layer", "Layer", {value: "main", autocomplete: "off"}, null],
  ["command", "Command", {required: true, autocomplete: "off", spellcheck: "false", class: "wide",
                          placeholder: "python3 render.py --frame #IFRAME#"},
   "one line, split into words like a shell (quotes respected, no shell run); #IFRAME# is the frame number"],
  ["range", "Frame range", {value: "1"}, "1-100, 1-100x5, 1,3,7"],
  ["chunk", "Chunk", {inputmode: "numeric", placeholder: "1"}, "frame numbers per frame"],
  ["gpus", "GPUs per frame", {inputmode: "numeric", placeholder: "0"}, null],
  ["gpu_vendor", "GPU vendor", null, null],
  ["gpu_models", "GPU models", {placeholder: "A100, RTX 4090", autocomplete: "off"}, "comma-separated; any of them"],
  ["gpu_memory_min", "GPU memory at least", {placeholder: "16G"}, "per device: 16G, 24G, 512M"],
  ["gpu_capability_min", "Compute capability at least", {placeholder: "8.9", autocomplete: "off"},
   "CUDA, per device: 8.9 < 8.10"],
  ["gpu_driver_min", "Driver at least", {placeholder: "535.104.05", autocomplete: "off"}, "per device"],
  ["gpu_cuda_min", "CUDA at least", {placeholder: "12.2", autocomplete: "off"}, "the driver's CUDA version"],
];
const GROUPS = [["Job", ["name", "priority"]], ["What runs", ["layer", "command", "range", "chunk"]],
  ["GPUs", ["gpus", "gpu_vendor", "gpu_models", "gpu_memory_min", "gpu_capability_min", "gpu_driver_min",
            "gpu_cuda_min"]]];

/** "12" -> 12; anything else stays text, for the server to refuse with its own message. */
const whole = (text) => (/^[+-]?\d+$/.test(text) ? Number(text) : text);

export function submitPage(main, ctx) {
  let stopped = false;
  ctx.ready().then((me) => !stopped && (me.read_only ? readOnly(main, me) : submitForm(main)), () => {});
  return () => {
    stopped = true;
  };
}

function readOnly(main, me) {
  main.append(el("h1", {text: "Submit a job"}),
    el("p", {class: "muted", text: `${me.user} has the read-only ${me.role} role: ask an admin for a user token to submit jobs.`}));
}

function submitForm(main) {
  const inputs = {};
  const errors = {};
  const field = ([name, label, attrs, help]) => {
    const id = `f-${name}`;
    const input = name === "gpu_vendor"
      ? el("select", {id, name}, el("option", {value: "", text: "any"}),
           ["NVIDIA", "AMD", "Apple", "Intel"].map((v) => el("option", {value: v, text: v})))
      : el("input", {id, name, type: "text", ...attrs});
    const error = el("p", {class: "field-error", "data-for": name, id: `${id}-error`});
    input.setAttribute("aria-describedby", `${id}-error${help ? ` ${id}-help` : ""}`);
    inputs[name] = input;
    errors[name] = error;
    return el("div", {class: `field ${name === "command" ? "wide" : ""}`}, el("label", {for: id, text: label}), input,
      help ? el("p", {class: "help muted", id: `${id}-help`, text: help}) : null, error);
  };
  const byName = Object.fromEntries(FIELDS.map((f) => [f[0], f]));
  const submitError = el("p", {id: "submit-error", class: "error", role: "alert"});
  const button = el("button", {id: "submit-job", type: "submit", class: "primary", text: "Submit job"});
  const form = el("form", {id: "submit-form", noValidate: true},
    GROUPS.map(([legend, names]) => el("fieldset", {}, el("legend", {text: legend}), names.map((n) => field(byName[n])))),
    el("div", {class: "buttons"}, button), submitError);
  main.append(el("h1", {text: "Submit a job"}), form);
  inputs.name.focus();

  function clearErrors() {
    submitError.textContent = "";
    for (const name of Object.keys(inputs)) {
      errors[name].textContent = "";
      inputs[name].removeAttribute("aria-invalid");
    }
  }

  function fieldError(name, message) {
    errors[name].textContent = message;
    inputs[name].setAttribute("aria-invalid", "true");
    inputs[name].focus();
  }

  /** The input a problem's field names: layers[0].gpus -> gpus, layers[0].gpu_models[1] ->
   * gpu_models, layers[0].name -> layer, name -> name; null for the rest. */
  function inputFor(problemField) {
    if (!problemField) return null;
    const inLayer = /^layers\[0\]\.([A-Za-z_]+)/.exec(problemField);
    const key = inLayer ? (inLayer[1] === "name" ? "layer" : inLayer[1]) : /^[A-Za-z_]+/.exec(problemField)?.[0];
    return key && key in inputs && !(key === "layer" && !inLayer) ? key : null;
  }

  function spec() {
    const v = Object.fromEntries(Object.entries(inputs).map(([k, i]) => [k, i.value.trim()]));
    const layer = {name: v.layer || "main", command: shellSplit(v.command), range: v.range || "1"};
    if (v.chunk) layer.chunk = whole(v.chunk);
    if (v.gpus) layer.gpus = whole(v.gpus);
    if (v.gpu_vendor) layer.gpu_vendor = v.gpu_vendor;
    const models = v.gpu_models.split(",").map((m) => m.trim()).filter(Boolean);
    if (models.length) layer.gpu_models = models;
    if (v.gpu_memory_min) layer.gpu_memory_min = v.gpu_memory_min;
    // Versions as text: "8.10" is not the number 8.1.
    for (const key of ["gpu_capability_min", "gpu_driver_min", "gpu_cuda_min"]) if (v[key]) layer[key] = v[key];
    const job = {name: v.name, layers: [layer]};
    if (v.priority) job.priority = whole(v.priority);
    return job;
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearErrors();
    let body;
    try {
      body = spec();
    } catch (err) {
      fieldError("command", `command: ${err.message}`);
      return;
    }
    button.disabled = true;
    try {
      const {data} = await api("/jobs", {method: "POST", body});
      location.hash = `#/jobs/${data.id}`;
    } catch (err) {
      const name = inputFor(err.field);
      if (name) fieldError(name, err.detail);
      else submitError.textContent = `${err.detail || err.message}${err.hint ? ` (${err.hint})` : ""}`;
    } finally {
      button.disabled = false;
    }
  });
}
