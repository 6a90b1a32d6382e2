// Bar charts drawn as inline SVG with DOM calls (the page's CSP allows no inline style or
// script, and the console loads no library): styled by classes in console.css.

const svgNS = 'http://www.w3.org/2000/svg';
const width = 560;
const height = 210;
const margin = { top: 12, right: 24, bottom: 30, left: 52 };

function svg(tag, attributes = {}, text) {
  const element = document.createElementNS(svgNS, tag);
  for (const [name, value] of Object.entries(attributes)) element.setAttribute(name, String(value));
  if (text !== undefined) element.textContent = text;
  return element;
}

/** A round top for the y axis: 1, 2, 5 × a power of ten, at least `max`. */
function niceCeiling(max) {
  if (!(max > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(max));
  for (const step of [1, 2, 5, 10]) if (step * power >= max) return step * power;
  return 10 * power;
}

function label(value) {
  if (value >= 1000) return value.toLocaleString('en-US', { maximumFractionDigits: 0 });
  if (Number.isInteger(value)) return String(value);
  return String(Number(value.toFixed(value < 1 ? 2 : 1)));
}

/**
 * A bar chart: `points` are `{ label, values: [v, …] }`, one bar per point, the values of a
 * point drawn over each other (the first behind, e.g. requests, then errors) with the
 * classes `series` names. `ticks` picks the points whose label the x axis shows. Returns an
 * `<svg>` with `aria-label` `title`; with no point, an empty-state text instead of bars.
 * `slots`: the width of the x axis in bars (a history shorter than it is drawn at the right,
 * `firstSlotLabel` under the axis's left end).
 */
export function barChart({ id, title, points, series, ticks, empty, slots = points.length, firstSlotLabel }) {
  const chart = svg('svg', {
    id, class: 'chart', viewBox: `0 0 ${width} ${height}`, role: 'img', 'aria-label': title,
  });
  chart.append(svg('title', {}, title));
  const plotWidth = width - margin.left - margin.right;
  const plotHeight = height - margin.top - margin.bottom;
  const bottom = margin.top + plotHeight;
  const top = niceCeiling(Math.max(0, ...points.flatMap((point) => point.values)));
  if (points.length === 0) {
    chart.append(svg('line', { class: 'baseline', x1: margin.left, x2: width - margin.right, y1: bottom, y2: bottom }));
    chart.append(svg('text', { class: 'empty', x: margin.left + plotWidth / 2, y: margin.top + plotHeight / 2,
      'text-anchor': 'middle' }, empty));
    return chart;
  }
  for (const fraction of [0, 0.5, 1]) {
    const y = bottom - fraction * plotHeight;
    chart.append(svg('line', { class: 'grid', x1: margin.left, x2: width - margin.right, y1: y, y2: y }));
    chart.append(svg('text', { class: 'axis', x: margin.left - 6, y: y + 4, 'text-anchor': 'end' }, label(top * fraction)));
  }
  const slot = plotWidth / Math.max(slots, points.length);
  const first = Math.max(slots, points.length) - points.length;
  const barWidth = Math.max(1, slot * 0.75);
  if (first >= 6 && firstSlotLabel) {
    chart.append(svg('text', { class: 'axis', x: (margin.left + slot / 2).toFixed(2), y: bottom + 20,
      'text-anchor': 'middle' }, firstSlotLabel));
  }
  const bars = svg('g', { class: 'bars' });
  points.forEach((point, index) => {
    const x = margin.left + (first + index) * slot + (slot - barWidth) / 2;
    point.values.forEach((value, which) => {
      const barHeight = top > 0 ? (value / top) * plotHeight : 0;
      const bar = svg('rect', { class: `bar ${series[which]}`, x: x.toFixed(2), y: (bottom - barHeight).toFixed(2),
        width: barWidth.toFixed(2), height: barHeight.toFixed(2) });
      bar.append(svg('title', {}, `${point.label}: ${label(value)}`));
      bars.append(bar);
    });
    if (ticks(index, points.length)) {
      chart.append(svg('text', { class: 'axis', x: (x + barWidth / 2).toFixed(2), y: bottom + 20, 'text-anchor': 'middle' },
        point.label));
    }
  });
  chart.append(bars);
  chart.append(svg('line', { class: 'baseline', x1: margin.left, x2: width - margin.right, y1: bottom, y2: bottom }));
  return chart;
}
