// Runs: a filtered list, and a run's page with its log streaming live (Server-Sent Events,
// resumed from the last byte seen after a dropped connection), how it ended in words,
// its duration, run again, and cancel.
import { h, clear } from "./dom.js";
import * as api from "./api.js";
import { t } from "./i18n.js";
import { when, duration, exitWords, zoneToMs, deviceZone } from "./format.js";
import { badge, table, field, button, act } from "./forms.js";
import { taskNames } from "./overview.js";

const STATUSES = ["queued", "running", "succeeded", "failed", "cancelled", "timed_out", "lost"];
const ORIGINS = ["scheduled", "manual", "fire_once", "retry"];

export async function page(view, params) {
  if (params[0]) return runPage(view, params[0]);
  return list(view);
}

async function list(view) {
  const names = await taskNames();
  const task = h("select", { id: "runs-task" }, h("option", { value: "", text: t("any") }),
    [...names].map(([id, name]) => h("option", { value: id, text: name })));
  const status = h("select", { id: "runs-status" }, h("option", { value: "", text: t("any") }),
    STATUSES.map((s) => h("option", { value: s, text: t(`status.${s}`) })));
  const origin = h("select", { id: "runs-origin" }, h("option", { value: "", text: t("any") }),
    ORIGINS.map((o) => h("option", { value: o, text: t(`origin.${o}`) })));
  const since = h("input", { id: "runs-since", type: "datetime-local" });
  const until = h("input", { id: "runs-until", type: "datetime-local" });
  const results = h("div", { class: "results" });
  const more = h("button", { type: "button", hidden: true }, t("more"));
  let next = null, shown = [];
  const out = h("p", { class: "notice", role: "status" });
  const query = () => {
    const q = { limit: 32 };
    if (task.value) q.taskId = task.value;
    if (status.value) q.statuses = [status.value];
    if (origin.value) q.origins = [origin.value];
    if (zoneToMs(since.value) !== null) q.sinceMs = zoneToMs(since.value);
    if (zoneToMs(until.value) !== null) q.untilMs = zoneToMs(until.value);
    return q;
  };
  const load = async (fresh) => {
    const q = query();
    if (!fresh && next) q.after = next;
    try {
      const page = await api.call("qledge.run.list", q);
      shown = fresh ? page.runs : [...shown, ...page.runs];
      next = page.next || null;
      out.textContent = "";
    } catch (error) {
      out.className = "notice bad";
      out.textContent = error.message;
      return;
    }
    more.hidden = !next;
    clear(results).append(table(t("nav.runs"), [t("col.run"), t("col.task"), t("col.status"), t("col.origin"),
      t("col.created"), t("col.duration"), t("col.exit")], shown.map((r) => [
      h("a", { href: `#/runs/${encodeURIComponent(r.id)}`, text: r.id.slice(0, 13) }), names.get(r.taskId) || r.taskId,
      badge(r.status), t(`origin.${r.origin}`), when(r.createdAtMs), duration(r.startedAtMs, r.finishedAtMs),
      exitWords(r)]), t("runs.none")));
  };
  more.addEventListener("click", () => load(false));
  const filters = h("form", { class: "filters", on: { submit: (e) => { e.preventDefault(); load(true); } } },
    field(t("col.task"), task), field(t("col.status"), status), field(t("col.origin"), origin),
    field(t("runs.since", { zone: deviceZone() }), since), field(t("runs.until", { zone: deviceZone() }), until),
    h("button", { type: "submit", class: "primary" }, t("runs.filter")));
  view.append(h("h1", { text: t("nav.runs") }), filters, out, results, more);
  await load(true);
}

function details(run, names) {
  return h("dl", { class: "facts", id: "run-facts" },
    h("dt", { text: t("col.status") }), h("dd", {}, badge(run.status)),
    h("dt", { text: t("col.task") }), h("dd", { text: `${names.get(run.taskId) || run.taskId} (${run.taskId})` }),
    h("dt", { text: t("col.origin") }), h("dd", { text: t(`origin.${run.origin}`) }),
    h("dt", { text: t("col.created") }), h("dd", { text: when(run.createdAtMs) }),
    h("dt", { text: t("run.started") }), h("dd", { text: when(run.startedAtMs) }),
    h("dt", { text: t("run.finished") }), h("dd", { text: when(run.finishedAtMs) }),
    h("dt", { text: t("col.duration") }), h("dd", { text: duration(run.startedAtMs, run.finishedAtMs ?? (run.startedAtMs ? Date.now() : null)) }),
    h("dt", { text: t("col.exit") }), h("dd", { id: "run-exit", text: exitWords(run) }),
    run.errorSummary ? [h("dt", { text: t("run.error") }), h("dd", { text: run.errorSummary })] : null,
    run.attempt > 1 ? [h("dt", { text: t("run.attempt") }), h("dd", {}, `${run.attempt} `,
      run.retryOf ? h("a", { href: `#/runs/${encodeURIComponent(run.retryOf)}`, text: t("run.retryof") }) : null)] : null,
    run.retryDueAtMs ? [h("dt", { text: t("run.retrydue") }), h("dd", { text: when(run.retryDueAtMs) })] : null,
    run.logTruncated ? [h("dt", { text: t("run.log") }), h("dd", { text: t("run.truncated") })] : null);
}

async function runPage(view, ref) {
  const [run, names] = await Promise.all([api.call("qledge.run.get", { runId: ref }), taskNames()]);
  const out = h("p", { class: "notice", role: "status" });
  const facts = h("div", {}, details(run, names));
  const actions = h("div", { class: "actions" });
  const log = h("pre", { class: "log", id: "run-log", role: "log", tabindex: "0", "aria-label": t("run.log") });
  const state = h("p", { class: "muted", id: "log-state", role: "status" });
  const refresh = async () => {
    const now = await api.call("qledge.run.get", { runId: run.id });
    clear(facts).append(details(now, names));
    renderActions(now);
    return now;
  };
  const renderActions = (r) => {
    clear(actions);
    const active = r.status === "queued" || r.status === "running";
    if (active && api.can("qledge.run.cancel")) {
      actions.append(button(t("run.cancel"), (e) => act(e.target, out, async () => {
        await api.call("qledge.run.cancel", { runId: r.id });
        await refresh();
        return t("run.cancelled");
      }), "danger"));
    }
    if (!active && api.can("qledge.run.start")) {
      actions.append(button(r.status === "succeeded" ? t("run.again") : t("run.retry"), (e) => act(e.target, out, async () => {
        const again = await api.call("qledge.run.start", { taskId: r.taskId });
        location.hash = `#/runs/${encodeURIComponent(again.id)}`;
      }), "primary"));
    }
  };
  renderActions(run);
  view.append(h("h1", {}, t("run.title"), " ", h("code", { text: run.id })), facts, actions, out,
    h("h2", { text: t("run.log") }), state, log);
  if (!api.can("qledge.run.log.read")) {
    state.textContent = t("run.nolog");
    return null;
  }
  return follow(run, log, state, refresh);
}

function follow(run, log, state, refresh) {
  const source = new EventSource(`/api/log?run=${encodeURIComponent(run.id)}`);
  let ended = false;
  state.textContent = t("log.live");
  source.addEventListener("log", (event) => {
    const part = JSON.parse(event.data);
    log.append(document.createTextNode(part.text));
    log.scrollTop = log.scrollHeight;
  });
  source.addEventListener("end", async (event) => {
    ended = true;
    source.close();
    state.textContent = JSON.parse(event.data).truncated ? t("log.endtrunc") : t("log.end");
    try { await refresh(); } catch { /* the facts stay as they were */ }
  });
  source.addEventListener("problem", (event) => {
    ended = true;
    source.close();
    state.textContent = JSON.parse(event.data).message;
  });
  source.addEventListener("error", () => {
    if (ended) return;
    // A dropped connection is retried by the browser from the last event; a refusal (the
    // cap on live logs, an ended session) closes the source: say so.
    state.textContent = source.readyState === EventSource.CLOSED ? t("log.closed") : t("log.reconnecting");
  });
  source.addEventListener("open", () => { if (!ended) state.textContent = t("log.live"); });
  return () => source.close();
}

