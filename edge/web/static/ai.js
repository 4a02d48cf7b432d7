// The AI operator: ask a question (its answer is the run's log), and the evidence record of
// each AI run: rounds, tools used, tokens, cost (each against the limit the run had), which budget ran out, if one did, and what was left.
import { h } from "./dom.js";
import * as api from "./api.js";
import { t } from "./i18n.js";
import { when, usd } from "./format.js";
import { table, field, setError, clearErrors, showRefusal, formError, section } from "./forms.js";

export async function page(view, params) {
  view.append(h("h1", { text: t("nav.ai") }));
  if (params[0]) return record(view, params[0]);
  if (api.can("qledge.agent.ask")) view.append(section(t("ai.ask"), askForm()));
  if (api.can("qinglong.agent.history.list")) {
    const page = await api.call("qinglong.agent.history.list", { limit: 32 });
    view.append(section(t("ai.history"), table(t("ai.history"), [t("col.run"), t("ai.state"), t("ai.rounds"),
      t("ai.tokens"), t("ai.cost"), t("ai.budget"), t("col.created")], page.records.map((r) => [
      h("a", { href: `#/ai/${encodeURIComponent(r.runId)}`, text: r.runId.slice(0, 13) }), r.state, r.rounds,
      `${r.inputTokens} / ${r.outputTokens}`, r.costUsd === null ? t("ai.unknown") : usd(r.costUsd),
      r.budget || "–", when(r.createdAtMs)]), t("ai.none"))));
  }
  return null;
}

function askForm() {
  const question = h("textarea", { id: "ai-question", rows: 3, maxlength: 2000, required: true });
  const top = formError();
  const form = h("form", { class: "form", novalidate: true, on: { submit: async (event) => {
    event.preventDefault();
    clearErrors(form);
    if (!question.value.trim()) { setError(question, t("v.required")); question.focus(); return; }
    try {
      const run = await api.call("qledge.agent.ask", { instruction: question.value.trim() });
      location.hash = `#/runs/${encodeURIComponent(run.id)}`; // the answer streams in as the run's log
    } catch (error) {
      showRefusal(form, error, { instruction: question, "*": () => question });
    }
  } } }, top, field(t("ai.question"), question, t("ai.question.hint")),
  h("button", { type: "submit", class: "primary" }, t("ai.submit")));
  return form;
}

async function record(view, runId) {
  const found = await api.call("qinglong.agent.history.get", { runId });
  if (!found.found) { view.append(h("p", { class: "notice bad", text: t("ai.notfound") })); return null; }
  const r = found.record;
  const tools = r.perRound.flatMap((round) => round.tools || []);
  const lim = r.limits; // null: a record kept before limits were
  const of = (used, limit) => (lim ? t("ai.of", { used, limit }) : String(used));
  view.append(h("dl", { class: "facts" },
    h("dt", { text: t("col.run") }), h("dd", {}, h("a", { href: `#/runs/${encodeURIComponent(r.runId)}`, text: r.runId })),
    h("dt", { text: t("ai.state") }), h("dd", { text: r.state }),
    h("dt", { text: t("ai.model") }), h("dd", { text: `${r.provider} · ${r.model}` }),
    h("dt", { text: t("ai.rounds") }), h("dd", { text: of(r.rounds, lim && lim.rounds) }),
    h("dt", { text: t("ai.tools") }), h("dd", { text: tools.length ? tools.join(", ") : "–" }),
    h("dt", { text: t("ai.tokens") }), h("dd", { text: `${of(r.inputTokens, lim && lim.inputTokens)} / ${of(r.outputTokens, lim && lim.outputTokens)}` }),
    h("dt", { text: t("ai.cost") }), h("dd", { text: r.costUsd === null ? t("ai.unknown") : (lim ? t("ai.of", { used: usd(r.costUsd), limit: usd(lim.costUsd) }) : usd(r.costUsd)) }),
    h("dt", { text: t("ai.budget") }), h("dd", { text: r.budget ? t("ai.budget.out", { name: r.budget }) : t("ai.budget.left") }),
    h("dt", { text: t("ai.remaining") }), h("dd", { text: lim ? t("ai.remaining.left", {
      rounds: Math.max(0, lim.rounds - r.rounds), input: Math.max(0, lim.inputTokens - r.inputTokens),
      output: Math.max(0, lim.outputTokens - r.outputTokens),
      cost: r.costUsd === null ? t("ai.unknown") : usd(Math.max(0, lim.costUsd - r.costUsd)) }) : t("ai.unknown") }),
    h("dt", { text: t("ai.instruction") }), h("dd", { text: r.instruction }),
    h("dt", { text: t("ai.answer") }), h("dd", { text: r.answerSummary || r.error || "–" })));
  return null;
}

