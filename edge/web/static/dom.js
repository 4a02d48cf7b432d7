// Building the page: every text goes in as a text node and every attribute through
// setAttribute, so whatever a task name or a log line holds is shown, never run.
// Nothing in the panel uses innerHTML, outerHTML, insertAdjacentHTML or document.write.

const SVG = "http://www.w3.org/2000/svg";

function fill(el, props, kids) {
  for (const [key, value] of Object.entries(props || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "on") for (const [type, fn] of Object.entries(value)) el.addEventListener(type, fn);
    else if (key === "text") el.textContent = String(value);
    else if (key === "value" || key === "checked") el[key] = value;
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const kid of kids.flat(Infinity)) {
    if (kid === null || kid === undefined || kid === false) continue;
    el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return el;
}

export function h(tag, props, ...kids) {
  return fill(document.createElement(tag), props, kids);
}

export function s(tag, props, ...kids) {
  return fill(document.createElementNS(SVG, tag), props, kids);
}

export function clear(el) {
  while (el.firstChild) el.firstChild.remove();
  return el;
}

let ids = 0;
export function uid(prefix) {
  ids += 1;
  return `${prefix}-${ids}`;
}

// A modal question with the keyboard in mind (native <dialog>: focus is kept inside, Esc
// cancels). Resolves true when confirmed.
export function ask(title, text, yes, no) {
  return new Promise((resolve) => {
    const titleId = uid("dlg");
    const dialog = h("dialog", { class: "dialog", "aria-labelledby": titleId },
      h("h2", { id: titleId, text: title }), h("p", { text }),
      h("div", { class: "row" },
        h("button", { type: "button", class: "danger", on: { click: () => dialog.close("yes") } }, yes),
        h("button", { type: "button", on: { click: () => dialog.close("no") } }, no)));
    dialog.addEventListener("close", () => { dialog.remove(); resolve(dialog.returnValue === "yes"); });
    document.body.append(dialog);
    dialog.showModal();
  });
}
