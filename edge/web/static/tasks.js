// Tasks: the list (searchable, Chinese names included), add and edit with a message next
// to each field, enable or disable, run now, and delete (its triggers too, once confirmed).
import { h, ask } from "./dom.js";
import * as api from "./api.js";
import { t } from "./i18n.js";
import { when } from "./format.js";
import { badge, table, field, setError, clearErrors, showRefusal, formError, button, act, notice } from "./forms.js";
import { recentRuns, latestByTask } from "./overview.js";

const NAME = /^[A-Za-z0-9][A-Za-z0-9._-]*$/;
const ENV = /^[A-Za-z_][A-Za-z0-9_]*$/;
const ACCOUNT = /^[A-Za-z0-9_][A-Za-z0-9._-]*$/;
const CONTROLS = /[\u0000-\u001f\u007f]/;
const EVENTS = ["failure", "recovery", "success", "lost", "skipped", "every"];

export async function page(view, params) {
  if (params[0] === "new") return form(view, null);
  if (params[0] === "edit" && params[1]) return form(view, await api.call("qledge.task.get", { taskId: params[1] }));
  return list(view);
}

function commandText(spec) {
  const c = spec.command;
  if (c.kind === "shell") return c.command;
  if (c.kind === "agent") return `AI: ${c.instruction}`;
  return [c.file, ...(c.args || [])].join(" ");
}

async function list(view) {
  const full = api.can("qledge.task.list");
  const [tasks, runs, upcoming] = await Promise.all([
    full ? api.all("qledge.task.list", { limit: 64 }, "tasks")
      : api.all("qinglong.task.list", { limit: 64 }, "tasks").then((found) => found.map((v) => ({
        id: v.taskId, name: v.name, enabled: v.enabled, kind: v.kind }))),
    recentRuns(Date.now() - 30 * 86_400_000, 4),
    api.can("qledge.trigger.upcoming") ? api.call("qledge.trigger.upcoming", { count: 100 }) : { fires: [] },
  ]);
  const latest = latestByTask(runs);
  const next = new Map();
  for (const fire of upcoming.fires) if (!next.has(fire.taskId)) next.set(fire.taskId, fire.atMs);
  const out = h("p", { class: "notice", role: "status" });
  const writes = api.can("qledge.task.update");
  const headers = [t("col.name"), t("col.command"), t("col.last"), t("col.next"), t("col.enabled"), t("col.actions")];
  const rows = tasks.map((task) => {
    const last = latest.get(task.id);
    const actions = h("div", { class: "actions" });
    if (api.can("qledge.run.start") && task.enabled) {
      actions.append(button(t("task.run"), async (e) => act(e.target, out, async () => {
        const run = await api.call("qledge.run.start", { taskId: task.id });
        location.hash = `#/runs/${encodeURIComponent(run.id)}`;
      })));
    }
    if (writes && task.kind !== "agent" && task.spec) {
      actions.append(h("a", { class: "button", href: `#/tasks/edit/${encodeURIComponent(task.id)}`, text: t("edit") }));
    }
    const toggle = task.enabled ? "qledge.task.disable" : "qledge.task.enable";
    if (api.can(toggle)) {
      actions.append(button(task.enabled ? t("disable") : t("enable"), async (e) => act(e.target, out, async () => {
        await api.call(toggle, { taskId: task.id });
        window.dispatchEvent(new Event("hashchange"));
      })));
    }
    if (api.can("qledge.task.delete")) {
      actions.append(button(t("delete"), async (e) => act(e.target, out, () => remove(task)), "danger"));
    }
    return [
      h("span", { class: "name" }, h("span", { class: "label", text: task.name }),
        task.name !== task.id ? h("span", { class: "muted id", text: ` ${task.id}` }) : null),
      h("code", { class: "cmd", text: task.spec ? commandText(task.spec) : t(`kind.${task.kind}`) }),
      last ? h("a", { href: `#/runs/${encodeURIComponent(last.id)}` }, badge(last.status)) : "–",
      next.has(task.id) ? when(next.get(task.id)) : "–",
      task.enabled ? t("yes") : t("no"),
      actions.childNodes.length ? actions : "–",
    ];
  });
  const search = h("input", { type: "search", id: "task-search", placeholder: t("task.search.ph") });
  const listing = table(t("nav.tasks"), headers, rows, t("task.none"));
  const trs = [...listing.querySelectorAll("tbody tr")];
  trs.forEach((tr, i) => { tr.dataset.search = `${tasks[i].id} ${tasks[i].name}`.toLowerCase(); });
  const count = h("p", { class: "muted", role: "status", "aria-live": "polite" });
  search.addEventListener("input", () => {
    const q = search.value.trim().toLowerCase();
    let shown = 0;
    for (const tr of trs) { tr.hidden = Boolean(q) && !tr.dataset.search.includes(q); shown += tr.hidden ? 0 : 1; }
    count.textContent = q ? t("task.found", { n: shown }) : "";
  });
  view.append(h("div", { class: "head" }, h("h1", { text: t("nav.tasks") }),
    api.can("qledge.task.create") ? h("a", { class: "button primary", href: "#/tasks/new", text: t("task.add") }) : null),
  tasks.length ? field(t("task.search"), search) : "", count, out, listing);
}

async function remove(task) {
  if (!await ask(t("task.delete.title", { name: task.name }), t("task.delete.text"), t("delete"), t("cancel"))) return "";
  try {
    await api.call("qledge.task.delete", { taskId: task.id });
  } catch (error) {
    if (error.code !== "conflict" || !/trigger/.test(error.message)) throw error;
    if (!await ask(t("task.delete.triggers"), error.message, t("task.delete.both"), t("cancel"))) return "";
    await api.call("qledge.task.delete", { taskId: task.id, withTriggers: true });
  }
  window.dispatchEvent(new Event("hashchange"));
  return t("task.deleted", { name: task.name });
}

function input(props) { return h("input", { type: "text", spellcheck: "false", ...props }); }

async function form(view, task) {
  const [secrets, channels] = await Promise.all([
    api.can("qledge.secret.list") ? api.call("qledge.secret.list", {}).then((r) => r.secrets.map((x) => x.name)) : [],
    api.can("qledge.notify.channel.list") ? api.call("qledge.notify.channel.list", {}).then((r) => r.channels.map((c) => c.name)) : [],
  ]);
  const spec = task ? task.spec : { command: { kind: "shell", command: "" } };
  if (spec.command.kind === "agent") {
    view.append(h("h1", { text: task.name }), notice(t("task.agent"), ""));
    return;
  }
  const f = {
    id: input({ id: "task-id", required: true, maxlength: 128, value: task ? task.id : "", readonly: task ? true : null }),
    name: input({ id: "task-name", maxlength: 128, value: task ? task.name : "" }),
    kind: h("select", { id: "task-kind" }, h("option", { value: "shell", text: t("kind.shell") }),
      h("option", { value: "argv", text: t("kind.argv") })),
    shell: h("textarea", { id: "task-shell", rows: 4, spellcheck: "false", maxlength: 16384 }),
    file: input({ id: "task-file", maxlength: 4096 }),
    args: h("textarea", { id: "task-args", rows: 3, spellcheck: "false" }),
    user: input({ id: "task-user", maxlength: 32, value: spec.user || "", autocomplete: "off" }),
    dir: input({ id: "task-dir", maxlength: 4096, value: spec.workingDir || "" }),
    timeout: h("input", { id: "task-timeout", type: "number", min: 1, max: 604800, step: 1,
      value: String((spec.timeoutMs || 3_600_000) / 1000) }),
    overlap: h("select", { id: "task-overlap" }, ["forbid", "allow", "replace"].map((o) =>
      h("option", { value: o, text: t(`overlap.${o}`) }))),
    retries: h("input", { id: "task-retries", type: "number", min: 0, max: 10, step: 1,
      value: String(spec.retry ? spec.retry.count : 0) }),
    delay: h("input", { id: "task-delay", type: "number", min: 0, max: 86400, step: 1,
      value: String(spec.retry ? spec.retry.delayS ?? 60 : 60) }),
    notify: h("select", { id: "task-notify" }, ["default", "none", "custom"].map((o) =>
      h("option", { value: o, text: t(`notify.mode.${o}`) }))),
  };
  f.kind.value = spec.command.kind;
  f.overlap.value = spec.overlap || "forbid";
  if (spec.command.kind === "shell") f.shell.value = spec.command.command;
  else { f.file.value = spec.command.file; f.args.value = (spec.command.args || []).join("\n"); }
  f.notify.value = spec.notify === undefined || spec.notify === null ? "default" : spec.notify.length ? "custom" : "none";
  const rule = spec.notify && spec.notify[0] ? spec.notify[0] : { channels: [], on: ["failure", "recovery"] };
  const channelBoxes = channels.map((name) => h("label", { class: "check" },
    h("input", { type: "checkbox", value: name, checked: rule.channels.includes(name) }), name));
  const eventBoxes = EVENTS.map((e) => h("label", { class: "check" },
    h("input", { type: "checkbox", value: e, checked: rule.on.includes(e) }), t(`event.${e}`)));
  const custom = h("fieldset", { class: "custom" }, h("legend", { text: t("notify.custom") }),
    h("div", { class: "checks", id: "task-channels", tabindex: "-1" }, channelBoxes.length ? channelBoxes : t("notify.nochannels")),
    h("div", { class: "checks" }, eventBoxes), h("p", { class: "err", id: "task-channels-err", role: "status" }));
  const envRows = h("div", { class: "env", id: "task-env", tabindex: "-1" });
  const addEnv = (name, value) => {
    const key = input({ "aria-label": t("env.name"), value: name || "", class: "env-name" });
    const type = h("select", { "aria-label": t("env.type") }, h("option", { value: "plain", text: t("env.plain") }),
      h("option", { value: "secret", text: t("env.secret") }));
    const plain = input({ "aria-label": t("env.value"), class: "env-value" });
    const secret = h("select", { "aria-label": t("env.secretname") }, secrets.map((n) => h("option", { value: n, text: n })));
    const isSecret = value && typeof value === "object";
    type.value = isSecret ? "secret" : "plain";
    if (isSecret) {
      if (!secrets.includes(value.secret)) secret.append(h("option", { value: value.secret, text: value.secret }));
      secret.value = value.secret;
    } else plain.value = value || "";
    const sync = () => { plain.hidden = type.value === "secret"; secret.hidden = type.value !== "secret"; };
    type.addEventListener("change", sync);
    sync();
    const row = h("div", { class: "env-row" }, key, type, plain, secret,
      button(t("env.remove"), () => row.remove(), "link"));
    envRows.append(row);
  };
  for (const [name, value] of Object.entries(spec.env || {})) addEnv(name, value);
  const shellField = field(t("task.shell"), f.shell, t("task.shell.hint"));
  const fileField = field(t("task.file"), f.file, t("task.file.hint"));
  const argsField = field(t("task.args"), f.args, t("task.args.hint"));
  const syncKind = () => {
    const shell = f.kind.value === "shell";
    shellField.hidden = !shell; fileField.hidden = shell; argsField.hidden = shell;
  };
  f.kind.addEventListener("change", syncKind);
  syncKind();
  const syncNotify = () => { custom.hidden = f.notify.value !== "custom"; };
  f.notify.addEventListener("change", syncNotify);
  syncNotify();
  const top = formError();
  const el = h("form", { class: "form", novalidate: true, on: { submit: async (event) => {
    event.preventDefault();
    clearErrors(el);
    const built = build(f, envRows, channelBoxes, eventBoxes, spec);
    if (!built) return;
    const submit = el.querySelector("button[type=submit]");
    submit.disabled = true;
    try {
      const name = f.name.value.trim() || undefined;
      if (task) await api.call("qledge.task.update", { taskId: task.id, expectedRevision: task.revision, spec: built, name });
      else await api.call("qledge.task.create", { taskId: f.id.value.trim(), spec: built, name });
      location.hash = "#/tasks";
    } catch (error) {
      showRefusal(el, error, { taskId: f.id, name: f.name, "spec.command.command": f.shell, "spec.command.file": f.file,
        "spec.command.args": f.args, "spec.user": f.user, "spec.group": f.user, "spec.workingDir": f.dir,
        "spec.env": envRows, "spec.timeoutMs": f.timeout, "spec.retry": f.retries, "spec.notify": f.notify,
        "*": (m) => (/exists/.test(m) && !task ? f.id : /user|group|privileged/.test(m) ? f.user
          : /secret/.test(m) ? envRows : /working dir/.test(m) ? f.dir : /program/.test(m) ? f.file : null) });
    } finally {
      submit.disabled = false;
    }
  } } },
  top,
  field(t("task.id"), f.id, t("task.id.hint")),
  field(t("task.name"), f.name, t("task.name.hint")),
  field(t("task.kind"), f.kind), shellField, fileField, argsField,
  field(t("task.user"), f.user, t("task.user.hint")),
  field(t("task.dir"), f.dir, t("task.dir.hint")),
  h("fieldset", {}, h("legend", { text: t("task.env") }), envRows,
    h("p", { class: "err", id: "task-env-err", role: "status" }),
    button(t("env.add"), () => addEnv("", ""))),
  field(t("task.timeout"), f.timeout, t("task.timeout.hint")),
  field(t("task.overlap"), f.overlap, t("task.overlap.hint")),
  field(t("task.retries"), f.retries, t("task.retries.hint")),
  field(t("task.delay"), f.delay),
  field(t("task.notify"), f.notify), custom,
  h("div", { class: "row" }, h("button", { type: "submit", class: "primary" }, task ? t("save") : t("task.create")),
    h("a", { class: "button", href: "#/tasks", text: t("cancel") })));
  view.append(h("h1", { text: task ? t("task.edit", { name: task.name }) : t("task.add") }),
    task ? h("p", { class: "muted", id: "task-revision", text: t("task.revision", { n: task.revision }) }) : "", el);
}

// The spec the form describes, or null after marking what is wrong (each message next to its field).
function build(f, envRows, channelBoxes, eventBoxes, old) {
  let ok = true;
  const bad = (el, message) => { setError(el, message); if (ok) el.focus(); ok = false; };
  const id = f.id.value.trim();
  if (!id) bad(f.id, t("v.required"));
  else if (!NAME.test(id) || id.length > 128) bad(f.id, t("v.name"));
  if (CONTROLS.test(f.name.value)) bad(f.name, t("v.controls"));
  const spec = { ...old };
  delete spec.command;
  if (f.kind.value === "shell") {
    if (!f.shell.value.trim()) bad(f.shell, t("v.required"));
    spec.command = { kind: "shell", command: f.shell.value };
    if (old.command.kind === "shell" && old.command.shell) spec.command.shell = old.command.shell;
  } else {
    const file = f.file.value.trim();
    if (!file) bad(f.file, t("v.required"));
    else if (file.includes("/") && !file.startsWith("/")) bad(f.file, t("v.abs"));
    spec.command = { kind: "argv", file, args: f.args.value.split("\n").filter((line) => line.length) };
  }
  const user = f.user.value.trim();
  if (user && !ACCOUNT.test(user)) bad(f.user, t("v.account"));
  if (user) spec.user = user; else delete spec.user;
  const dir = f.dir.value.trim();
  if (dir && !dir.startsWith("/")) bad(f.dir, t("v.abs"));
  if (dir) spec.workingDir = dir; else delete spec.workingDir;
  const env = {};
  for (const row of envRows.querySelectorAll(".env-row")) {
    const [key, type, plain, secret] = row.querySelectorAll("input, select");
    const name = key.value.trim();
    if (!name && !plain.value) continue;
    if (!ENV.test(name) || name.startsWith("QLEDGE_")) { bad(envRows, t("v.env", { name })); continue; }
    if (type.value === "secret") {
      if (!secret.value) { bad(envRows, t("v.secret", { name })); continue; }
      env[name] = { secret: secret.value };
    } else env[name] = plain.value;
  }
  if (Object.keys(env).length) spec.env = env; else delete spec.env;
  const timeout = Number(f.timeout.value);
  if (!Number.isInteger(timeout) || timeout < 1 || timeout > 604800) bad(f.timeout, t("v.range", { min: 1, max: 604800 }));
  spec.timeoutMs = timeout * 1000;
  spec.overlap = f.overlap.value;
  const retries = Number(f.retries.value), delay = Number(f.delay.value);
  if (!Number.isInteger(retries) || retries < 0 || retries > 10) bad(f.retries, t("v.range", { min: 0, max: 10 }));
  if (!Number.isFinite(delay) || delay < 0 || delay > 86400) bad(f.delay, t("v.range", { min: 0, max: 86400 }));
  if (retries > 0) spec.retry = { ...(old.retry || {}), count: retries, delayS: delay }; else delete spec.retry;
  if (f.notify.value === "default") delete spec.notify;
  else if (f.notify.value === "none") spec.notify = [];
  else {
    const chosen = channelBoxes.map((l) => l.querySelector("input")).filter((b) => b.checked).map((b) => b.value);
    const on = eventBoxes.map((l) => l.querySelector("input")).filter((b) => b.checked).map((b) => b.value);
    if (!chosen.length || !on.length) bad(document.getElementById("task-channels"), t("v.rule"));
    spec.notify = [{ channels: chosen, on }];
  }
  return ok ? spec : null;
}

