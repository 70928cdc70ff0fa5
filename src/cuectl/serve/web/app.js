// The cuectl web monitor: a single-page app with hash routes over the public REST API.
//
//   #/login       token sign-in          #/jobs         jobs with live progress
//   #/jobs/<id>   layers, frames, logs   #/hosts        GPU inventory with live values
//   #/hosts/<name> one host: devices, running frames, lock/unlock (admins)
//   #/submit      a one-layer job spec
//
// Each page is a function (main, ctx, ...params) that fills <main> and returns a cleanup
// function (stops its timers and requests) called when the route changes.

import {api, onUnauthorized, session} from "./api.js";
import {el} from "./dom.js";
import {clearError, initBanner, showError} from "./ui.js";
import {jobsPage} from "./jobs.js";
import {jobPage} from "./job.js";
import {hostsPage} from "./hosts.js";
import {hostPage} from "./host.js";
import {submitPage} from "./submit.js";

const main = document.getElementById("app");
let me = null;          // GET /whoami of the signed-in caller
let whoami = null;      // the promise of it
let cleanup = null;     // the current page's
let loginMessage = "";  // why we are back at the login page (a 401)

const ctx = {
  get me() {
    return me;
  },
  /** Resolves to ``me`` once known (pages that show or hide things by role wait for it). */
  ready: () => (me ? Promise.resolve(me) : whoami),
  /** May the caller change this job? (The server checks again; this only hides buttons.) */
  canChange(job) {
    return !!me && (me.role === "admin" || (me.role === "user" && job.user === me.user));
  },
};

const routes = [
  [/^#\/jobs$/, jobsPage],
  [/^#\/jobs\/(\d+)$/, jobPage],
  [/^#\/hosts$/, hostsPage],
  [/^#\/hosts\/([^/]+)$/, hostPage],
  [/^#\/submit$/, submitPage],
];

onUnauthorized((err) => {
  // A refused token (revoked, expired): say why. No token at all: just the sign-in page.
  const hadToken = !!session.token();
  session.clear();
  me = null;
  if (location.hash === "#/login") return; // a late answer to a request of the page we left
  loginMessage = hadToken ? `${err.detail || "The token was refused"}. Sign in again.` : "";
  location.hash = "#/login";
});

function header() {
  const signedIn = !!me && location.hash !== "#/login";
  document.querySelector("header nav").hidden = !signedIn;
  document.querySelector("header .me").hidden = !signedIn;
  if (!signedIn) return;
  document.getElementById("whoami").textContent = me.user;
  document.getElementById("role-badge").textContent = me.read_only ? "read-only" : me.role;
  document.getElementById("role-badge").dataset.role = me.role;
  document.querySelector('nav a[href="#/submit"]').hidden = me.read_only;
  for (const link of document.querySelectorAll("nav a")) {
    const here = location.hash === link.getAttribute("href") || location.hash.startsWith(`${link.getAttribute("href")}/`);
    if (here) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
}

async function route() {
  if (cleanup) cleanup();
  cleanup = null;
  clearError();
  const hash = location.hash;
  if (hash === "#/login") {
    header();
    cleanup = loginPage();
    return;
  }
  const match = routes.map(([re, page]) => [re.exec(hash), page]).find(([m]) => m);
  if (!match) {
    location.replace("#/jobs");
    return;
  }
  if (!me) {
    // A saved token, or none: a server started with --allow-anonymous-read answers
    // whoami without one (a viewer); otherwise the 401 sends us to the login page. The
    // page starts its own requests meanwhile (one round trip less before the data).
    whoami = api("/whoami").then(({data}) => {
      me = data;
      if (location.hash === hash) header();
      return me;
    });
    whoami.catch((err) => err.status !== 401 && showError(err));
  } else {
    header();
  }
  const [m, page] = match;
  main.replaceChildren();
  cleanup = page(main, ctx, ...m.slice(1)) || null;
}

function loginPage() {
  const token = el("input", {id: "token", type: "password", autocomplete: "current-password", required: true,
                             "aria-describedby": "login-error"});
  const remember = el("input", {id: "remember", type: "checkbox"});
  const error = el("p", {id: "login-error", class: "error", role: "alert", text: loginMessage});
  loginMessage = "";
  const submit = el("button", {id: "login-submit", type: "submit", class: "primary", text: "Sign in"});
  const form = el("form", {class: "login card"},
    el("h1", {text: "Sign in to cuectl"}),
    el("label", {for: "token", text: "API token"}), token,
    el("label", {class: "check"}, remember, " Remember me on this computer"),
    submit, error,
    el("p", {class: "muted", text: "An admin creates tokens with: cuectl admin token create USER"}));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const secret = token.value.trim();
    if (!secret) {
      error.textContent = "Enter your API token.";
      return;
    }
    submit.disabled = true;
    error.textContent = "";
    try {
      me = (await api("/whoami", {token: secret, quiet401: true})).data;
      session.save(secret, remember.checked);
      location.hash = "#/jobs";
    } catch (err) {
      error.textContent = err.detail || err.message;
    } finally {
      submit.disabled = false;
    }
  });
  main.replaceChildren(form);
  token.focus();
  return null;
}

document.getElementById("logout").addEventListener("click", () => {
  session.clear();
  me = null;
  location.hash = "#/login";
});

initBanner();
// Escape closes the frame panel (dialogs close themselves).
document.addEventListener("keydown", (event) => {
  if (event.key === "Escape" && !document.querySelector("dialog[open]")) {
    document.getElementById("frame-panel-close")?.click();
  }
});
window.addEventListener("hashchange", route);
route();
