// Notifications: channels with their health, a test that shows what the channel answered,
// the project's default rule, adding a channel, and the recent deliveries.
import { h, ask } from "./dom.js";
import * as api from "./api.js";
import { t } from "./i18n.js";
import { when } from "./format.js";
import { table, field, setError, clearErrors, showRefusal, formError, button, act, section } from "./forms.js";

const EVENTS = ["failure", "recovery", "success", "lost", "skipped", "every"];
// A starting point per kind: secrets are named ({"secret": NAME}), never written here.
const TEMPLATES = {
  telegram: { kind: "telegram", token: { secret: "TG_BOT_TOKEN" }, chatId: "123456789" },
  ntfy: { kind: "ntfy", topic: "my-router" },
  bark: { kind: "bark", deviceKey: { secret: "BARK_KEY" } },
  wecom: { kind: "wecom", key: { secret: "WECOM_KEY" } },
  dingtalk: { kind: "dingtalk", accessToken: { secret: "DINGTALK_TOKEN" } },
  feishu: { kind: "feishu", hook: { secret: "FEISHU_HOOK" } },
  pushplus: { kind: "pushplus", token: { secret: "PUSHPLUS_TOKEN" } },
  serverchan: { kind: "serverchan", sendKey: { secret: "SERVERCHAN_KEY" } },
  gotify: { kind: "gotify", baseUrl: "https://gotify.example", token: { secret: "GOTIFY_TOKEN" } },
  webhook: { kind: "webhook", url: "https://hooks.example/qledge" },
  smtp: { kind: "smtp", host: "smtp.example.com", sender: "router@example.com", to: ["me@example.com"],
    username: "router@example.com", password: { secret: "SMTP_PASSWORD" } },
};

function health(channel) {
  const hl = channel.health;
  if (!hl || (!hl.failures && !hl.lastOkAtMs)) return h("span", { class: "muted", text: t("ch.untried") });
  if (!hl.failures) return h("span", { class: "good", text: t("ch.ok", { when: when(hl.lastOkAtMs) }) });
  return h("span", { class: "bad", text: t("ch.failing", { n: hl.failures, since: when(hl.failingSinceMs),
    error: hl.lastError || "" }) });
}

export async function page(view) {
  const [listed, rules, deliveries] = await Promise.all([
    api.call("qledge.notify.channel.list", {}),
    api.can("qledge.notify.rules.get") ? api.call("qledge.notify.rules.get", {}) : { rules: null },
    api.can("qledge.notify.log") ? api.call("qledge.notify.log", { limit: 20 }) : { records: [] },
  ]);
  const channels = listed.channels;
  const out = h("p", { class: "notice", role: "status", id: "notify-out" });
  const rows = channels.map((c) => {
    const actions = h("div", { class: "actions" });
    const result = h("span", { class: "test-result", role: "status" });
    if (api.can("qledge.notify.test")) {
      actions.append(button(t("ch.test"), async (e) => {
        result.className = "test-result muted";
        result.textContent = t("ch.testing");
        await act(e.target, null, async () => {
          try {
            const answer = await api.call("qledge.notify.test", { channel: c.name });
            result.className = `test-result ${answer.ok ? "good" : "bad"}`;
            result.textContent = answer.ok ? t("ch.test.ok", { detail: answer.detail || "" })
              : t("ch.test.bad", { detail: answer.detail || "" });
          } catch (error) {
            result.className = "test-result bad";
            result.textContent = error.message;
          }
        });
      }));
    }
    if (api.can("qledge.notify.channel.delete")) {
      actions.append(button(t("delete"), (e) => act(e.target, out, async () => {
        if (!await ask(t("ch.delete.title", { name: c.name }), t("ch.delete.text"), t("delete"), t("cancel"))) return "";
        await api.call("qledge.notify.channel.delete", { name: c.name });
        window.dispatchEvent(new Event("hashchange"));
        return "";
      }), "danger"));
    }
    return [c.name, c.kind, health(c), h("div", {}, actions, result)];
  });
  view.append(h("h1", { text: t("nav.notify") }), out,
    section(t("ch.list"), table(t("ch.list"), [t("col.name"), t("ch.kind"), t("ch.health"), t("col.actions")], rows,
      t("ch.none"))),
    section(t("rules.title"), rulesView(rules.rules, channels)),
    api.can("qledge.notify.channel.set") ? section(t("ch.add"), addForm()) : "",
    section(t("ch.log"), table(t("ch.log"), [t("col.when"), t("ch.channel"), t("ch.event"), t("col.task"), t("ch.state")],
      deliveries.records.map((r) => [when(r.createdAtMs), r.channel, r.event, r.taskId || "–",
        r.lastError ? h("span", { class: "bad", text: `${r.state}: ${r.lastError}` }) : r.state]), t("ch.nolog"))));
}

function rulesView(rules, channels) {
  const shown = h("p", { text: rules && rules.length
    ? rules.map((r) => t("rules.one", { channels: r.channels.join(", "), on: r.on.map((e) => t(`event.${e}`)).join(", ") })).join("; ")
    : t("rules.none") });
  if (!api.can("qledge.notify.rules.set") || !channels.length) return shown;
  const current = rules && rules[0] ? rules[0] : { channels: [], on: ["failure", "recovery"] };
  const boxes = channels.map((c) => h("label", { class: "check" },
    h("input", { type: "checkbox", value: c.name, checked: current.channels.includes(c.name) }), c.name));
  const events = EVENTS.map((e) => h("label", { class: "check" },
    h("input", { type: "checkbox", value: e, checked: current.on.includes(e) }), t(`event.${e}`)));
  const err = h("p", { class: "err", role: "status" });
  const form = h("form", { class: "form", on: { submit: async (event) => {
    event.preventDefault();
    const chosen = boxes.map((b) => b.firstChild).filter((b) => b.checked).map((b) => b.value);
    const on = events.map((b) => b.firstChild).filter((b) => b.checked).map((b) => b.value);
    err.textContent = "";
    try {
      await api.call("qledge.notify.rules.set", { rules: chosen.length && on.length ? [{ channels: chosen, on }] : null });
      window.dispatchEvent(new Event("hashchange"));
    } catch (error) {
      err.textContent = error.message;
    }
  } } },
  h("fieldset", {}, h("legend", { text: t("rules.channels") }), h("div", { class: "checks" }, boxes)),
  h("fieldset", {}, h("legend", { text: t("rules.events") }), h("div", { class: "checks" }, events)),
  err, h("button", { type: "submit" }, t("rules.save")));
  return h("div", {}, shown, h("p", { class: "hint", text: t("rules.hint") }), form);
}

function addForm() {
  const name = h("input", { id: "ch-name", type: "text", maxlength: 128, required: true, spellcheck: "false" });
  const kind = h("select", { id: "ch-kind" }, Object.keys(TEMPLATES).map((k) => h("option", { value: k, text: k })));
  const spec = h("textarea", { id: "ch-spec", rows: 6, spellcheck: "false" });
  const fill = () => { spec.value = JSON.stringify(TEMPLATES[kind.value], null, 2); };
  kind.addEventListener("change", fill);
  fill();
  const top = formError();
  const form = h("form", { class: "form", novalidate: true, on: { submit: async (event) => {
    event.preventDefault();
    clearErrors(form);
    let value;
    try { value = JSON.parse(spec.value); } catch { setError(spec, t("v.json")); spec.focus(); return; }
    if (!name.value.trim()) { setError(name, t("v.required")); name.focus(); return; }
    try {
      await api.call("qledge.notify.channel.set", { name: name.value.trim(), spec: value });
      window.dispatchEvent(new Event("hashchange"));
    } catch (error) {
      showRefusal(form, error, { name, spec, "*": () => spec });
    }
  } } }, top, field(t("col.name"), name), field(t("ch.kind"), kind), field(t("ch.spec"), spec, t("ch.spec.hint")),
  h("button", { type: "submit", class: "primary" }, t("ch.save")));
  return form;
}

