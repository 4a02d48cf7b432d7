// The security audit (owners): every call, who made it, through what, and the refused calls
// counted together per minute.
import { h, clear } from "./dom.js";
import * as api from "./api.js";
import { t } from "./i18n.js";
import { when } from "./format.js";
import { table } from "./forms.js";

export async function page(view) {
  const results = h("div", {});
  const more = h("button", { type: "button", hidden: true }, t("more"));
  let shown = [], next = null;
  const load = async () => {
    const found = await api.call("qledge.audit.list", next === null ? { limit: 50 } : { limit: 50, before: next });
    shown = [...shown, ...found.entries];
    next = found.next ?? null;
    more.hidden = next === null;
    clear(results).append(table(t("nav.audit"), [t("col.when"), t("au.who"), t("au.tool"), t("au.outcome"),
      t("au.why"), t("au.via"), t("au.calls")], shown.map((e) => [
      when(e.atMs), e.principal, e.tool, h("span", { class: e.outcome === "allowed" ? "" : "bad", text: t(`outcome.${e.outcome}`) }),
      e.reasons.filter((r) => !r.startsWith("tool_")).join(", ") || "–", e.transport,
      e.count > 1 ? t("au.count", { n: e.count, last: when(e.lastAtMs) }) : "1"]), t("au.none")));
  };
  more.addEventListener("click", load);
  view.append(h("h1", { text: t("nav.audit") }), h("p", { class: "hint", text: t("au.intro") }), results, more);
  await load();
}
