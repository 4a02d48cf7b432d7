// Times in the device's zone (the daemon's), sizes, durations, and how a run ended, in words.
import { t, language } from "./i18n.js";

let zone = "UTC";
export function setZone(name) { zone = name || "UTC"; }
export function deviceZone() { return zone; }

function formatter(options) {
  try {
    return new Intl.DateTimeFormat(language(), { timeZone: zone, hourCycle: "h23", ...options });
  } catch {
    return new Intl.DateTimeFormat(language(), { timeZone: "UTC", hourCycle: "h23", ...options });
  }
}

// 2026-12-01 08:30:05, in every language: one way to read a time on every page.
export function when(ms) {
  if (ms === null || ms === undefined) return "–";
  const parts = {};
  for (const p of formatter({ year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit",
    second: "2-digit" }).formatToParts(new Date(ms))) parts[p.type] = p.value;
  return `${parts.year}-${parts.month}-${parts.day} ${parts.hour}:${parts.minute}:${parts.second}`;
}

export function hourOf(ms) {
  return Number(formatter({ hour: "numeric" }).format(new Date(ms))) % 24;
}

// How long something took, the CLI's rule (edge/__init__.py duration_text): tenths of a second under
// a minute (0.4s, 59.9s), then minutes and seconds (1m04s), then hours and minutes (2h05m).
export function duration(start, end) {
  if (start === null || start === undefined || end === null || end === undefined) return "–";
  const ms = Math.max(0, end - start);
  const tenths = Math.round(ms / 100);
  if (tenths < 600) return `${(tenths / 10).toFixed(1)}s`;
  const seconds = Math.max(60, Math.floor(ms / 1000));
  const pad = (n) => String(n).padStart(2, "0");
  const m = Math.floor(seconds / 60);
  if (m < 60) return `${m}m${pad(seconds % 60)}s`;
  return `${Math.floor(m / 60)}h${pad(m % 60)}m`;
}

// A cost in US dollars, to the hundredth of a cent (what an AI run's evidence records).
export function usd(v) { return `$${v.toFixed(4)}`; }

export function bytes(n) {
  if (n === null || n === undefined) return "–";
  for (const [unit, size] of [["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]]) {
    if (n >= size) return `${(n / size).toFixed(1).replace(/\.0$/, "")} ${unit}`;
  }
  return `${n} B`;
}

const SIGNALS = { 1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE",
  9: "SIGKILL", 11: "SIGSEGV", 13: "SIGPIPE", 14: "SIGALRM", 15: "SIGTERM" };
const SIGNAL_WORDS = { 9: "sig.kill", 15: "sig.term", 11: "sig.segv", 2: "sig.int", 6: "sig.abrt", 1: "sig.hup" };

// How a run ended: "exited with code 3", "killed by SIGKILL (forced to stop)", …
export function exitWords(run) {
  const code = run.exitCode;
  if (code === null || code === undefined) {
    if (run.status === "queued" || run.status === "running") return t("exit.notyet");
    return run.errorCode ? t("exit.never", { code: run.errorCode }) : "–";
  }
  if (code === 0) return t("exit.ok");
  if (code > 0) return t("exit.code", { code });
  const sig = -code;
  const name = SIGNALS[sig] || `signal ${sig}`;
  return SIGNAL_WORDS[sig] ? t("exit.signal.why", { name, why: t(SIGNAL_WORDS[sig]) }) : t("exit.signal", { name });
}

export const FAILED = new Set(["failed", "timed_out", "lost"]);

// A wall-clock time typed in a date picker ("2026-12-01T08:30"), read in the device's zone.
export function zoneToMs(local) {
  const m = /^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2})/.exec(local || "");
  if (!m) return null;
  const asUtc = Date.UTC(+m[1], +m[2] - 1, +m[3], +m[4], +m[5]);
  let ms = asUtc;
  for (let i = 0; i < 2; i += 1) ms = asUtc - offset(ms);
  return ms;
}

function offset(ms) {
  let parts;
  try {
    parts = new Intl.DateTimeFormat("en-US", { timeZone: zone, hourCycle: "h23", year: "numeric", month: "2-digit",
      day: "2-digit", hour: "2-digit", minute: "2-digit", second: "2-digit" }).formatToParts(new Date(ms));
  } catch {
    return 0;
  }
  const get = (type) => Number(parts.find((p) => p.type === type).value);
  return Date.UTC(get("year"), get("month") - 1, get("day"), get("hour") % 24, get("minute"), get("second"))
    - Math.floor(ms / 1000) * 1000;
}
