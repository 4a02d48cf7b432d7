// The shell: sign-in, the header and navigation, the language switch, and one page at a
// time in <main>, chosen by the address's #fragment (no reload, no server routes).
import { h, clear } from "./dom.js";
import * as api from "./api.js";
import { t, setLanguage, language, LANGS } from "./i18n.js";
import { setZone, deviceZone } from "./format.js";
import { formError } from "./forms.js";

const PAGES = [
  { path: "", key: "nav.overview", tools: ["qledge.status"], load: () => import("./overview.js") },
  { path: "tasks", key: "nav.tasks", tools: ["qledge.task.list", "qinglong.task.list"], load: () => import("./tasks.js") },
  { path: "schedules", key: "nav.schedules", tools: ["qledge.trigger.list", "qledge.trigger.upcoming"],
    load: () => import("./schedules.js") },
  { path: "runs", key: "nav.runs", tools: ["qledge.run.list"], load: () => import("./runs.js") },
  { path: "secrets", key: "nav.secrets", tools: ["qledge.secret.list"], load: () => import("./secrets.js") },
  { path: "notify", key: "nav.notify", tools: ["qledge.notify.channel.list"], load: () => import("./notify.js") },
  { path: "ai", key: "nav.ai", tools: ["qledge.agent.ask", "qinglong.agent.history.list"], load: () => import("./ai.js") },
  { path: "audit", key: "nav.audit", tools: ["qledge.audit.list"], load: () => import("./audit.js") },
];

const root = document.getElementById("app");
let signedIn = false;
let leave = null;
let shown = 0;

function visible(page) { return page.tools.some((tool) => api.can(tool)); }

function route() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  const page = PAGES.find((p) => p.path === parts[0]) || PAGES[0];
  return { page, params: parts.slice(1) };
}

function header() {
  const { page } = route();
  const nav = h("nav", { "aria-label": t("nav.label") }, h("ul", {}, PAGES.filter(visible).map((p) =>
    h("li", {}, h("a", { href: `#/${p.path}`, "aria-current": p === page ? "page" : null, text: t(p.key) })))));
  const other = language() === "en" ? "zh-CN" : "en";
  return h("header", { class: "top" },
    h("div", { class: "bar" },
      h("a", { class: "brand", href: "#/" }, "qledge"),
      h("span", { class: "who", text: t(`role.${api.role()}`) }),
      h("span", { class: "zone", text: t("zone", { zone: deviceZone() }) }),
      h("button", { type: "button", class: "link", lang: other, on: { click: () => switchLanguage(other) } },
        LANGS[other]),
      h("button", { type: "button", class: "link", id: "logout", on: { click: signOut } }, t("signout"))),
    nav);
}

function switchLanguage(next) {
  setLanguage(next);
  render();
}

async function signOut() {
  try { await api.logout(); } catch { /* the session may have ended already */ }
  signedIn = false;
  showLogin("");
}

function skip() {
  return h("a", { class: "skip", href: "#main", on: { click: (e) => { e.preventDefault(); document.getElementById("main").focus(); } } },
    t("skip"));
}

export async function render() {
  if (!signedIn) return;
  if (leave) { leave(); leave = null; }
  const { page, params } = route();
  const main = h("main", { id: "main", tabindex: "-1" });
  clear(root).append(skip(), header(), main);
  document.title = `${t(page.key)} · qledge`;
  const ticket = ++shown;
  if (!visible(page)) {
    main.append(h("h1", { text: t(page.key) }), h("p", { class: "notice bad", text: t("page.denied") }));
    return;
  }
  main.append(h("p", { class: "loading", text: t("loading") }));
  try {
    const module = await page.load();
    const view = h("div", { class: "page" });
    const cleanup = await module.page(view, params);
    if (ticket !== shown) { if (cleanup) cleanup(); return; }
    leave = cleanup || null;
    clear(main).append(view);
  } catch (error) {
    if (ticket !== shown) return;
    if (error instanceof api.ApiError && error.status === 401) return;
    clear(main).append(h("h1", { text: t(page.key) }), h("p", { class: "notice bad", role: "alert", text: error.message }));
  }
  if (document.activeElement === document.body || !document.activeElement) main.focus({ preventScroll: true });
}

function showLogin(message) {
  if (leave) { leave(); leave = null; }
  document.title = `${t("login.title")} · qledge`;
  const input = h("input", { id: "token", name: "token", type: "password", autocomplete: "off", required: true,
    spellcheck: "false", "aria-describedby": "token-hint" });
  const error = formError();
  error.id = "login-error";
  if (message) error.textContent = message;
  const other = language() === "en" ? "zh-CN" : "en";
  const form = h("form", { class: "login", on: { submit: async (event) => {
    event.preventDefault();
    error.textContent = "";
    const submit = form.querySelector("button[type=submit]");
    submit.disabled = true;
    try {
      await api.login(input.value);
      input.value = "";
      await start();
    } catch (e) {
      error.textContent = e.code === "unauthenticated" ? t("login.bad") : e.message;
      input.focus();
    } finally {
      submit.disabled = false;
    }
  } } },
  h("label", { for: "token", text: t("login.token") }), input,
  h("p", { class: "hint", id: "token-hint", text: t("login.hint") }), error,
  h("button", { type: "submit", class: "primary" }, t("login.submit")));
  const main = h("main", { id: "main", tabindex: "-1", class: "login-page" },
    h("h1", { text: t("login.title") }), form,
    h("p", {}, h("button", { type: "button", class: "link", lang: other, on: { click: () => {
      setLanguage(other); showLogin(error.textContent);
    } } }, LANGS[other])));
  clear(root).append(main);
  input.focus();
}

async function start() {
  signedIn = true;
  if (api.can("qledge.status")) {
    try { setZone((await api.call("qledge.status", {})).timezone); } catch { /* shown on the overview */ }
  }
  render();
}

api.signedOutHandler(() => {
  if (!signedIn) return;
  signedIn = false;
  showLogin(t("login.expired"));
});

window.addEventListener("hashchange", render);

(async () => {
  try {
    await api.session();
  } catch {
    showLogin("");
    return;
  }
  await start();
})();
