// Schedules: cron triggers with a live preview of the next five fires in the device's zone,
// busybox's day-of-month/day-of-week rule when it applies, and the misfire policy in words.
import { h, clear, ask } from "./dom.js";
import * as api from "./api.js";
import { t } from "./i18n.js";
import { when, deviceZone } from "./format.js";
import { table, field, setError, clearErrors, showRefusal, formError, button, act, section } from "./forms.js";
import { taskNames } from "./overview.js";

export async function page(view) {
  const full = api.can("qledge.trigger.list");
  const [triggers, names, upcoming] = await Promise.all([
    full ? api.all("qledge.trigger.list", { limit: 64 }, "triggers") : [],
    taskNames(),
    api.can("qledge.trigger.upcoming") ? api.call("qledge.trigger.upcoming", { count: 20 }) : { fires: [] },
  ]);
  const out = h("p", { class: "notice", role: "status" });
  view.append(h("h1", { text: t("nav.schedules") }), out);
  if (api.can("qledge.trigger.create")) view.append(section(t("sch.add"), addForm(names)));
  if (full) {
    const rows = triggers.map((tr) => {
      const actions = h("div", { class: "actions" });
      const toggle = tr.enabled ? "qledge.trigger.disable" : "qledge.trigger.enable";
      if (api.can(toggle)) {
        actions.append(button(tr.enabled ? t("disable") : t("enable"), (e) => act(e.target, out, async () => {
          await api.call(toggle, { triggerId: tr.id });
          window.dispatchEvent(new Event("hashchange"));
        })));
      }
      if (api.can("qledge.trigger.delete")) {
        actions.append(button(t("delete"), (e) => act(e.target, out, async () => {
          if (!await ask(t("sch.delete.title", { id: tr.id }), t("sch.delete.text"), t("delete"), t("cancel"))) return "";
          await api.call("qledge.trigger.delete", { triggerId: tr.id });
          window.dispatchEvent(new Event("hashchange"));
          return "";
        }), "danger"));
      }
      return [tr.id, names.get(tr.taskId) || tr.taskId, h("code", { text: tr.spec.expression }), tr.spec.timezone,
        t(`misfire.${tr.spec.misfire}`), tr.enabled ? when(tr.nextFireAtMs) : t("sch.off"), actions];
    });
    view.append(section(t("sch.list"), table(t("sch.list"), [t("col.trigger"), t("col.task"), t("col.cron"),
      t("col.zone"), t("col.misfire"), t("col.next"), t("col.actions")], rows, t("sch.none"))));
  }
  view.append(section(t("ov.next"), table(t("ov.next"), [t("col.when"), t("col.task"), t("col.trigger")],
    upcoming.fires.map((f) => [when(f.atMs), names.get(f.taskId) || f.taskId, f.triggerId]), t("ov.none.next"))));
}

function addForm(names) {
  const task = h("select", { id: "sch-task", required: true }, [...names].map(([id, name]) =>
    h("option", { value: id, text: name === id ? id : `${name} (${id})` })));
  const expr = h("input", { id: "sch-cron", type: "text", required: true, maxlength: 256, spellcheck: "false",
    value: "0 3 * * *", autocomplete: "off" });
  const zone = h("input", { id: "sch-zone", type: "text", maxlength: 64, value: deviceZone(), spellcheck: "false" });
  const misfire = h("select", { id: "sch-misfire" }, ["skip", "fire_once"].map((m) =>
    h("option", { value: m, text: t(`misfire.${m}`) })));
  const explain = h("p", { class: "hint", id: "sch-misfire-why" });
  const jitter = h("input", { id: "sch-jitter", type: "number", min: 0, max: 3600, value: "0" });
  const preview = h("div", { class: "preview", id: "sch-preview", "aria-live": "polite" });
  const sync = () => { explain.textContent = t(`misfire.${misfire.value}.why`); };
  misfire.addEventListener("change", sync);
  sync();
  let timer = 0, asked = 0;
  const refresh = () => {
    clearTimeout(timer);
    timer = setTimeout(async () => {
      const ticket = ++asked;
      try {
        const p = await api.call("qledge.cron.preview", { expression: expr.value.trim(), timezone: zone.value.trim() || null });
        if (ticket !== asked) return;
        setError(expr, "");
        clear(preview).append(h("p", { text: t("sch.preview", { zone: p.timezone }) }),
          p.event ? h("p", { class: "notice", text: t(`sch.event.${p.event}`) })
            : h("ol", {}, p.fires.map((ms) => h("li", {}, h("time", { datetime: new Date(ms).toISOString(),
              text: when(ms) })))),
          p.daysOred ? h("p", { class: "notice", text: t("sch.daysored") }) : null);
      } catch (error) {
        if (ticket !== asked) return;
        clear(preview);
        setError(/zone/i.test(error.message) ? zone : expr, error.message);
      }
    }, 250);
  };
  expr.addEventListener("input", refresh);
  zone.addEventListener("input", refresh);
  refresh();
  const top = formError();
  const form = h("form", { class: "form", novalidate: true, on: { submit: async (event) => {
    event.preventDefault();
    clearErrors(form);
    if (!task.value) { setError(task, t("v.required")); task.focus(); return; }
    if (!expr.value.trim()) { setError(expr, t("v.required")); expr.focus(); return; }
    const j = Number(jitter.value);
    if (!Number.isInteger(j) || j < 0 || j > 3600) { setError(jitter, t("v.range", { min: 0, max: 3600 })); jitter.focus(); return; }
    try {
      await api.call("qledge.trigger.create", { taskId: task.value, expression: expr.value.trim(),
        timezone: zone.value.trim() || null, misfire: misfire.value, jitterS: j });
      window.dispatchEvent(new Event("hashchange"));
    } catch (error) {
      showRefusal(form, error, { taskId: task, expression: expr, timezone: zone, jitterS: jitter,
        "*": (m) => (/zone/i.test(m) ? zone : /cron|field|expression|expected/i.test(m) ? expr : null) });
    }
  } } },
  top, field(t("col.task"), task), field(t("sch.cron"), expr, t("sch.cron.hint")), preview,
  field(t("col.zone"), zone, t("sch.zone.hint")), field(t("col.misfire"), misfire), explain,
  field(t("sch.jitter"), jitter, t("sch.jitter.hint")),
  h("button", { type: "submit", class: "primary" }, t("sch.create")));
  return form;
}
