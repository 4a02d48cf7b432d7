// Strings in English and Simplified Chinese. A key missing from the chosen language is
// shown as ⟦key⟧ and listed on <html data-missing-strings>, so a test finds it at once.
import { STRINGS } from "./strings.js";

export const LANGS = { en: "English", "zh-CN": "中文" };
let lang = LANGS[document.documentElement.lang] ? document.documentElement.lang : "en";
const missing = new Set();

export function language() { return lang; }

export function setLanguage(next) {
  lang = LANGS[next] ? next : "en";
  document.documentElement.lang = lang;
  document.cookie = `qledge_lang=${lang}; Path=/; Max-Age=31536000; SameSite=Strict`;
}

export function t(key, vars) {
  let text = STRINGS[lang][key];
  if (text === undefined) {
    missing.add(key);
    document.documentElement.dataset.missingStrings = [...missing].join(" ");
    console.error(`missing string ${lang}:${key}`);
    return `⟦${key}⟧`;
  }
  if (vars) text = text.replace(/\{(\w+)\}/g, (m, name) => (name in vars ? String(vars[name]) : m));
  return text;
}
