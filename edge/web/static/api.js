// The panel's server: every call is a tool call made there with this user's token.
// The CSRF token lives in this module only (never in storage); the session cookie is
// HttpOnly and this code never sees it.

export class ApiError extends Error {
  constructor(code, message, status) {
    super(message);
    this.code = code;
    this.status = status;
  }
}

const state = { csrf: "", tools: new Set(), role: "", info: null, onSignedOut: () => {} };

export function signedOutHandler(fn) { state.onSignedOut = fn; }
export function can(tool) { return state.tools.has(tool); }
export function role() { return state.role; }
export function info() { return state.info; }

function adopt(about) {
  state.csrf = about.csrf;
  state.tools = new Set(about.tools);
  state.role = about.role;
  state.info = about;
  return about;
}

async function answer(response) {
  let body = null;
  try { body = await response.json(); } catch { body = null; }
  if (response.ok) return body;
  const error = (body && body.error) || { code: "unavailable", message: `HTTP ${response.status}` };
  throw new ApiError(error.code, error.message, response.status);
}

async function post(path, value, withCsrf) {
  const headers = { "Content-Type": "application/json" };
  if (withCsrf) headers["X-CSRF-Token"] = state.csrf;
  const response = await fetch(path, { method: "POST", headers, body: JSON.stringify(value || {}),
    credentials: "same-origin", cache: "no-store" });
  return answer(response);
}

export async function session() {
  const response = await fetch("/api/session", { credentials: "same-origin", cache: "no-store" });
  return adopt(await answer(response));
}

export async function login(token) { return adopt(await post("/api/login", { token }, false)); }

export async function logout() {
  try { await post("/api/logout", {}, true); } finally { state.tools = new Set(); state.csrf = ""; }
}

export async function call(tool, args) {
  try {
    const body = await post(`/api/call/${tool}`, args, true);
    return body.result;
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) state.onSignedOut();
    throw error;
  }
}

// Every page of a keyset-paged list, up to `pages` of them.
export async function all(tool, args, key, pages = 16) {
  const found = [];
  let after = null;
  for (let i = 0; i < pages; i += 1) {
    const page = await call(tool, after === null ? args : { ...args, after });
    found.push(...page[key]);
    after = page.next ?? null;
    if (after === null || (page.hasMore === false)) break;
  }
  return found;
}
