// Building the page: elements with text (never HTML parsed from data), and formatting.

/**
 * An element: `h('a', { href: '#/' , class: 'x' }, 'text', child, …)`. Attributes named
 * `on…` add listeners; `hidden`, `disabled` and other booleans are set when true. Children
 * that are strings become text nodes.
 */
export function h(tag, attributes = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith('on') && typeof value === 'function') {
      element.addEventListener(name.slice(2), value);
    } else if (value === true) {
      element.setAttribute(name, '');
    } else {
      element.setAttribute(name, String(value));
    }
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return element;
}

/** Replaces the children of `parent` with `children`. */
export function replace(parent, ...children) {
  parent.replaceChildren(...children.flat().filter((child) => child !== null && child !== undefined));
}

/** `2026-11-22 04:10:02 UTC`, or `never`. */
export function time(text) {
  if (!text) return 'never';
  const date = new Date(text);
  if (Number.isNaN(date.getTime())) return text;
  return date.toISOString().replace('T', ' ').slice(0, 19) + ' UTC';
}

/** A count with thousands separators. */
export function count(value) {
  return typeof value === 'number' ? value.toLocaleString('en-US') : '—';
}

/** Seconds as `3 d 4 h`, `5 h 6 min`, `7 min`, `8 s`. */
export function duration(seconds) {
  const s = Math.max(0, Math.round(seconds));
  const d = Math.floor(s / 86400);
  const hours = Math.floor((s % 86400) / 3600);
  const minutes = Math.floor((s % 3600) / 60);
  if (d > 0) return `${d} d ${hours} h`;
  if (hours > 0) return `${hours} h ${minutes} min`;
  if (minutes > 0) return `${minutes} min`;
  return `${s} s`;
}

/** An `<input type="datetime-local">` value (local time) as RFC 3339 UTC, or ''. */
export function localToUTC(value) {
  if (!value) return '';
  const date = new Date(value);
  return Number.isNaN(date.getTime()) ? '' : date.toISOString();
}

/** A message box: `kind` is `error`, `ok` or `info`. */
export function notice(kind, text) {
  return h('p', { class: `notice ${kind}`, role: kind === 'error' ? 'alert' : 'status' }, text);
}
