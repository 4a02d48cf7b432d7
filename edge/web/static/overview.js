// Overview: what runs now, what is failing (red), the next fires, the last 24 hours,
// and what the device spends (flash written per day, memory), with the version.
import { h } from "./dom.js";
import * as api from "./api.js";
import { t } from "./i18n.js";
import { when, bytes, FAILED } from "./format.js";
import { badge, table, section } from "./forms.js";
import { chart, hourly } from "./chart.js";

const DAY = 86_400_000;

export async function recentRuns(sinceMs, pages = 8) {
  if (!api.can("qledge.run.list")) return [];
  return api.all("qledge.run.list", { sinceMs, limit: 64 }, "runs", pages);
}

// The newest run of each task among `runs` (newest first).
export function latestByTask(runs) {
  const latest = new Map();
  for (const run of runs) if (!latest.has(run.taskId)) latest.set(run.taskId, run);
  return latest;
}

export async function taskNames() {
  const names = new Map();
  if (api.can("qledge.task.list")) {
    for (const task of await api.all("qledge.task.list", { limit: 64 }, "tasks")) names.set(task.id, task.name);
  } else if (api.can("qinglong.task.list")) {
    for (const task of await api.all("qinglong.task.list", { limit: 64 }, "tasks")) names.set(task.taskId, task.name);
  }
  return names;
}

function runLink(run, names) {
  return h("a", { href: `#/runs/${encodeURIComponent(run.id)}` }, names.get(run.taskId) || run.taskId);
}

export async function page(view) {
  const now = Date.now();
  const [status, runs, names, upcoming] = await Promise.all([
    api.call("qledge.status", {}),
    recentRuns(now - DAY),
    taskNames(),
    api.can("qledge.trigger.upcoming") ? api.call("qledge.trigger.upcoming", { count: 5 }) : { fires: [] },
  ]);
  const active = runs.filter((r) => r.status === "running" || r.status === "queued");
  const failing = [...latestByTask(runs).values()].filter((r) => FAILED.has(r.status));
  const info = api.info();
  view.append(h("div", { class: "head" }, h("h1", { text: t("nav.overview") }),
    h("button", { type: "button", on: { click: () => window.dispatchEvent(new Event("hashchange")) } }, t("refresh"))),
    h("div", { class: "cards" },
      section(t("ov.running"), table(t("ov.running"), [t("col.task"), t("col.status"), t("col.started")],
        active.map((r) => [runLink(r, names), badge(r.status), when(r.startedAtMs || r.createdAtMs)]), t("ov.none.running"))),
      section(t("ov.failing"), failing.length
        ? h("ul", { class: "failing" }, failing.map((r) => h("li", { class: "bad" }, badge(r.status), " ",
          runLink(r, names), " ", h("span", { class: "muted", text: when(r.finishedAtMs || r.createdAtMs) }))))
        : h("p", { class: "empty good", text: t("ov.none.failing") })),
      section(t("ov.next"), table(t("ov.next"), [t("col.when"), t("col.task")],
        upcoming.fires.map((f) => [when(f.atMs), names.get(f.taskId) || f.taskId]), t("ov.none.next"))),
      section(t("ov.chart"), chart(hourly(runs, now)),
        h("p", { class: "legend" }, h("span", { class: "key ok" }), t("chart.ok"), " ", h("span", { class: "key bad" }),
          t("chart.bad"))),
      section(t("ov.device"), h("dl", { class: "facts" },
        h("dt", { text: t("ov.flash") }), h("dd", { text: t("ov.perday", { n: bytes(status.writtenBytesPerDay) }) }),
        h("dt", { text: t("ov.memory") }), h("dd", { text: bytes(status.rssBytes) }),
        h("dt", { text: t("ov.panelmemory") }), h("dd", { text: bytes(info.panelRssBytes) }),
        h("dt", { text: t("ov.counts") }), h("dd", { text: t("ov.countsv", { tasks: status.counts.tasks,
          triggers: status.counts.triggers, runs: status.counts.runs }) }),
        h("dt", { text: t("ov.version") }), h("dd", { text: status.version }),
        h("dt", { text: t("ov.zone") }), h("dd", { text: status.timezone })))));
}
