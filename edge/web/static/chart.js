// The last 24 hours of runs as bars, one per hour: successes stacked under failures.
import { s } from "./dom.js";
import { t } from "./i18n.js";
import { FAILED, hourOf } from "./format.js";

const HOUR = 3600_000;

export function hourly(runs, now) {
  const start = Math.floor(now / HOUR) * HOUR - 23 * HOUR;
  const bins = Array.from({ length: 24 }, (_, i) => ({ at: start + i * HOUR, ok: 0, bad: 0 }));
  for (const run of runs) {
    const i = Math.floor((run.createdAtMs - start) / HOUR);
    if (i < 0 || i > 23) continue;
    if (run.status === "succeeded") bins[i].ok += 1;
    else if (FAILED.has(run.status)) bins[i].bad += 1;
  }
  return bins;
}

export function chart(bins) {
  const width = 480, height = 120, gap = 2, bar = width / 24 - gap, top = Math.max(1, ...bins.map((b) => b.ok + b.bad));
  const scale = (n) => (n / top) * (height - 20);
  const ok = bins.reduce((n, b) => n + b.ok, 0), bad = bins.reduce((n, b) => n + b.bad, 0);
  const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img",
    "aria-label": t("chart.label", { ok, bad }) });
  bins.forEach((b, i) => {
    const x = i * (bar + gap);
    const hOk = scale(b.ok), hBad = scale(b.bad);
    const group = s("g", {}, s("title", { text: t("chart.bar", { hour: hourOf(b.at), ok: b.ok, bad: b.bad }) }));
    if (b.ok) group.append(s("rect", { x, y: height - 16 - hOk, width: bar, height: hOk, class: "ok" }));
    if (b.bad) group.append(s("rect", { x, y: height - 16 - hOk - hBad, width: bar, height: hBad, class: "bad" }));
    if (!b.ok && !b.bad) group.append(s("rect", { x, y: height - 17, width: bar, height: 1, class: "none" }));
    if (i % 6 === 0) group.append(s("text", { x, y: height - 2, class: "axis", text: `${hourOf(b.at)}:00` }));
    svg.append(group);
  });
  return svg;
}
