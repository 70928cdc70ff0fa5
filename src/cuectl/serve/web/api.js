// The REST API client: bearer token, problem+json errors, ETags, streamed logs.
//
// URLs are relative ("api/v1/..."), resolved against the page at "/", so the monitor
// also works behind a proxy that serves cuectl under a path prefix.

const KEY = "cuectl.token";
const BASE = "api/v1";

/** The token lives in sessionStorage (gone with the tab) unless "remember me" put it in
 * localStorage. */
export const session = {
  token: () => sessionStorage.getItem(KEY) || localStorage.getItem(KEY),
  save(token, remember) {
    session.clear();
    (remember ? localStorage : sessionStorage).setItem(KEY, token);
  },
  clear() {
    sessionStorage.removeItem(KEY);
    localStorage.removeItem(KEY);
  },
};

/** An error answer as its RFC 9457 problem: status, title, detail, field, hint. */
export class ApiError extends Error {
  constructor(status, problem) {
    super(problem.detail || problem.title || `HTTP ${status}`);
    this.status = status;
    this.title = problem.title || `HTTP ${status}`;
    this.detail = problem.detail || "";
    this.field = problem.field || null;
    this.hint = problem.hint || null;
  }
}

let unauthorized = () => {};
/** Called with the ApiError of any 401 (the app returns to the login page). */
export function onUnauthorized(handler) {
  unauthorized = handler;
}

function headers(token, extra = {}) {
  const h = {Accept: "application/json", ...extra};
  if (token) h.Authorization = `Bearer ${token}`;
  return h;
}

async function failure(res) {
  let problem = {};
  try {
    problem = await res.json();
  } catch {
    problem = {title: res.statusText, detail: `HTTP ${res.status}`};
  }
  return new ApiError(res.status, problem);
}

async function send(path, init, {token = session.token(), quiet401 = false} = {}) {
  let res;
  try {
    res = await fetch(`${BASE}${path}`, {cache: "no-store", ...init, headers: headers(token, init.headers)});
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new ApiError(0, {title: "Network error", detail: "cannot reach the cuectl server"});
  }
  if (res.status === 304 || res.ok) return res;
  const error = await failure(res);
  if (res.status === 401 && !quiet401) unauthorized(error);
  throw error;
}

/** GET (or any method with a JSON body) -> {status, data, etag}; 304 gives data null.
 * Options: method, body, etag (sent as If-None-Match), signal, token, quiet401. */
export async function api(path, opts = {}) {
  const init = {method: opts.method || "GET", signal: opts.signal, headers: {}};
  if (opts.etag) init.headers["If-None-Match"] = opts.etag;
  if (opts.body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(opts.body);
  }
  const res = await send(path, init, opts);
  const etag = res.headers.get("ETag");
  if (res.status === 304) return {status: 304, data: null, etag: opts.etag};
  return {status: res.status, data: await res.json(), etag};
}

/** GET a text body, handing each decoded piece to onText as it arrives (a followed log
 * streams until the frame ends). Resolves when the body ends. */
export async function streamText(path, onText, signal) {
  const res = await send(path, {signal, headers: {Accept: "text/plain"}});
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  for (;;) {
    const {value, done} = await reader.read();
    if (done) break;
    onText(decoder.decode(value, {stream: true}));
  }
  const rest = decoder.decode();
  if (rest) onText(rest);
}

/** Run ``fn`` now (or after ``ms`` with now: false) and then every ``ms`` after it finishes; never two at once (a call while
 * one runs queues one more run). Paused while the tab is hidden: a background tab costs
 * the server nothing, and catches up as soon as it is shown. Returns {now(), stop()}. */
export function poll(fn, ms, {now = true} = {}) {
  let timer = null;
  let running = false;
  let again = false;
  let stopped = false;
  async function run() {
    if (stopped) return;
    if (running) {
      again = true;
      return;
    }
    clearTimeout(timer);
    running = true;
    try {
      await fn();
    } finally {
      running = false;
    }
    if (stopped) return;
    if (again) {
      again = false;
      run();
    } else if (!document.hidden) {
      timer = setTimeout(run, ms);
    }
  }
  const onVisible = () => !document.hidden && run();
  document.addEventListener("visibilitychange", onVisible);
  if (now) run();
  else timer = setTimeout(run, ms);
  return {
    now: run,
    stop() {
      stopped = true;
      clearTimeout(timer);
      document.removeEventListener("visibilitychange", onVisible);
    },
  };
}
