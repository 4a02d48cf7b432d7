// Secrets: their names, which tasks use them, and setting or replacing a value. A value
// goes in and never comes back: the field is emptied once it is stored.
import { h, ask } from "./dom.js";
import * as api from "./api.js";
import { t } from "./i18n.js";
import { when } from "./format.js";
import { table, field, setError, clearErrors, showRefusal, formError, button, act, section } from "./forms.js";

const NAME = /^[A-Za-z0-9][A-Za-z0-9._-]*$/;

export async function page(view) {
  const [listed, tasks] = await Promise.all([
    api.call("qledge.secret.list", {}),
    api.can("qledge.task.list") ? api.all("qledge.task.list", { limit: 64 }, "tasks") : [],
  ]);
  const users = new Map();
  for (const task of tasks) {
    for (const value of Object.values(task.spec.env || {})) {
      if (value && typeof value === "object") users.set(value.secret, [...(users.get(value.secret) || []), task.name]);
    }
  }
  const out = h("p", { class: "notice", role: "status" });
  const name = h("input", { id: "secret-name", type: "text", maxlength: 128, required: true, spellcheck: "false",
    autocomplete: "off" });
  const value = h("input", { id: "secret-value", type: "password", required: true, maxlength: 16384,
    autocomplete: "new-password" });
  const top = formError();
  const form = h("form", { class: "form", novalidate: true, on: { submit: async (event) => {
    event.preventDefault();
    clearErrors(form);
    const n = name.value.trim();
    if (!NAME.test(n)) { setError(name, t("v.name")); name.focus(); return; }
    if (!value.value) { setError(value, t("v.required")); value.focus(); return; }
    try {
      await api.call("qledge.secret.set", { name: n, value: value.value });
      value.value = "";
      window.dispatchEvent(new Event("hashchange"));
    } catch (error) {
      value.value = "";
      showRefusal(form, error, { name, value });
    }
  } } }, top, field(t("col.name"), name, t("secret.name.hint")), field(t("secret.value"), value, t("secret.value.hint")),
  h("button", { type: "submit", class: "primary" }, t("secret.save")));
  const rows = listed.secrets.map((secret) => {
    const actions = h("div", { class: "actions" });
    if (api.can("qledge.secret.set")) {
      actions.append(button(t("secret.replace"), () => { name.value = secret.name; value.focus(); }));
    }
    if (api.can("qledge.secret.delete")) {
      actions.append(button(t("delete"), (e) => act(e.target, out, async () => {
        if (!await ask(t("secret.delete.title", { name: secret.name }), t("secret.delete.text"), t("delete"), t("cancel"))) return "";
        await api.call("qledge.secret.delete", { name: secret.name });
        window.dispatchEvent(new Event("hashchange"));
        return "";
      }), "danger"));
    }
    return [secret.name, (users.get(secret.name) || []).join(", ") || "–", when(secret.updatedAtMs), actions];
  });
  view.append(h("h1", { text: t("nav.secrets") }), h("p", { class: "hint", text: t("secret.intro") }), out,
    section(t("secret.list"), table(t("secret.list"), [t("col.name"), t("secret.users"), t("col.updated"), t("col.actions")],
      rows, t("secret.none"))),
    api.can("qledge.secret.set") ? section(t("secret.set"), form) : "");
}
