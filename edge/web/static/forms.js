// Pieces every page uses: fields with their messages, status badges, tables that become
// cards on a phone, and putting a daemon's refusal next to the field it is about.
import { h, uid } from "./dom.js";
import { t } from "./i18n.js";
import { FAILED } from "./format.js";

export function field(label, input, hint) {
  const id = input.id || uid("f");
  input.id = id;
  const err = h("p", { class: "err", id: `${id}-err`, role: "status" });
  const help = hint ? h("p", { class: "hint", id: `${id}-hint`, text: hint }) : null;
  input.setAttribute("aria-describedby", [help && help.id, err.id].filter(Boolean).join(" "));
  return h("div", { class: "field", "data-field": id }, h("label", { for: id, text: label }), input, help, err);
}

export function setError(input, message) {
  const err = document.getElementById(`${input.id}-err`);
  if (err) err.textContent = message || "";
  if (message) input.setAttribute("aria-invalid", "true");
  else input.removeAttribute("aria-invalid");
}

export function clearErrors(form) {
  for (const el of form.querySelectorAll("[aria-invalid]")) setError(el, "");
  const top = form.querySelector(".form-error");
  if (top) top.textContent = "";
}

// The daemon names the offending field in its message (`… - at `$.spec.timeoutMs``):
// the message goes next to that field when the form has it, else at the top.
export function showRefusal(form, error, paths) {
  const message = error.message || String(error);
  const at = /at `\$\.([\w.[\]]+)`/.exec(message);
  const key = at ? at[1].replace(/\[\d+\]/g, "") : null;
  let target = null;
  if (key) {
    const best = Object.keys(paths).filter((p) => key === p || key.startsWith(`${p}.`))
      .sort((a, b) => b.length - a.length)[0];
    if (best) target = paths[best];
  }
  if (!target && paths["*"] && paths["*"](message)) target = paths["*"](message);
  if (target) {
    setError(target, message);
    target.focus();
  } else {
    const top = form.querySelector(".form-error");
    top.textContent = message;
    top.focus();
  }
}

export function formError() {
  return h("p", { class: "form-error", role: "alert", tabindex: "-1" });
}

export function badge(status) {
  const kind = FAILED.has(status) ? "bad" : status === "succeeded" ? "good" : status === "running" ? "busy" : "idle";
  return h("span", { class: `badge ${kind}`, "data-status": status, text: t(`status.${status}`) });
}

export function table(caption, headers, rows, empty) {
  if (!rows.length) return h("p", { class: "empty", text: empty || t("list.empty") });
  return h("div", { class: "table-wrap" }, h("table", { class: "list" },
    h("caption", { class: "sr-only", text: caption }),
    h("thead", {}, h("tr", {}, headers.map((name) => h("th", { scope: "col", text: name })))),
    h("tbody", {}, rows.map((cells) => h("tr", {}, cells.map((cell, i) =>
      h("td", { "data-label": headers[i] }, cell)))))));
}

export function notice(text, kind) {
  return h("p", { class: `notice ${kind || ""}`, role: kind === "bad" ? "alert" : "status", text });
}

export function button(text, onClick, kind) {
  return h("button", { type: "button", class: kind || null, on: { click: onClick } }, text);
}

// Runs an action from a button: busy while it runs, its refusal shown in `out`.
export async function act(btn, out, fn) {
  btn.disabled = true;
  try {
    const done = await fn();
    if (out && done) { out.className = "notice good"; out.textContent = done; }
  } catch (error) {
    if (out) { out.className = "notice bad"; out.textContent = error.message; }
  } finally {
    btn.disabled = false;
  }
}

export function section(title, ...kids) {
  const id = uid("s");
  return h("section", { "aria-labelledby": id }, h("h2", { id, text: title }), kids);
}
