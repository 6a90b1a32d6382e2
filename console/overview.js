// Overview: the server's figures, refreshed every few seconds while shown.
import { api } from './api.js';
import { barChart } from './chart.js';
import { count, duration, h, notice, replace } from './dom.js';

const refreshMilliseconds = 5000;

function card(label, value, detail, id) {
  return h('div', { class: 'card', id },
    h('div', { class: 'label' }, label),
    h('div', { class: 'value' }, value),
    detail ? h('div', { class: 'detail' }, detail) : null);
}

/** `0012_supabase_import` as its number over its name, which may wrap (the card is narrow). */
function schema(version) {
  if (!version) return 'none';
  const match = /^(\d+)_(.*)$/.exec(version);
  if (!match) return version;
  return h('span', { class: 'schema', title: version },
    h('span', {}, match[1]), h('span', { class: 'schema-name' }, match[2].replaceAll('_', ' ')));
}

function rate(now, before, field) {
  if (!before) return '—';
  const seconds = now.sampled_at - before.sampled_at;
  if (seconds <= 0) return '—';
  return ((now[field] - before[field]) / seconds).toFixed(2);
}

/** `14:05` (UTC) of a Unix time in seconds. */
function clock(seconds) {
  return new Date(seconds * 1000).toISOString().slice(11, 16);
}

/** The two charts: requests and 5xx per second by minute (last hour), events per day (30 days). */
function charts(now) {
  const minutes = now.requests_per_minute || [];
  const days = now.events_per_day || [];
  // The current minute, and quarter hours far enough from it for their labels not to overlap.
  const everyQuarterHour = (index, length) =>
    index === length - 1 || ((minutes[index].start / 60) % 15 === 0 && length - 1 - index >= 6);
  const weekly = (index, length) => (length - 1 - index) % 7 === 0;
  return [
    h('figure', { class: 'chart-panel', id: 'chart-requests' },
      h('figcaption', {},
        h('span', {}, 'Requests / s, last hour (UTC, per minute)'),
        h('span', { class: 'legend' }, h('span', { class: 'swatch requests' }), 'all',
          h('span', { class: 'swatch errors' }, ''), '5xx')),
      barChart({
        id: 'requests-chart', title: 'Requests and 5xx answers per second, per minute, last hour',
        points: minutes.map((minute) => ({ label: clock(minute.start),
          values: [minute.requests_per_second, minute.errors_per_second] })),
        series: ['requests', 'errors'], ticks: everyQuarterHour, slots: 60,
        firstSlotLabel: minutes.length ? clock(minutes[minutes.length - 1].start - 59 * 60) : undefined, empty: 'No minute counted yet' })),
    h('figure', { class: 'chart-panel', id: 'chart-events' },
      h('figcaption', {}, h('span', {}, 'Events stored per day, last 30 days (UTC)')),
      barChart({
        id: 'events-chart', title: 'Events stored per day, last 30 days',
        points: days.every((day) => day.events === 0) ? [] :
          days.map((day) => ({ label: day.day.slice(5), values: [day.events] })),
        series: ['events'], ticks: weekly, slots: 30, empty: 'No events in the last 30 days' })),
  ];
}

/** Renders the overview into `main` until `isCurrent()` turns false. */
export async function renderOverview(main, isCurrent) {
  const cards = h('div', { class: 'cards', id: 'overview-cards' });
  const chartArea = h('div', { class: 'charts', id: 'overview-charts' });
  const status = h('div', { class: 'status' });
  replace(main,
    h('section', { class: 'panel', id: 'overview' },
      h('div', { class: 'heading' }, h('h1', {}, 'Overview'), h('span', { class: 'muted', id: 'refreshed' }, '')),
      cards, chartArea, status));
  let previous = null;
  while (isCurrent()) {
    try {
      const now = await api('GET', '/overview');
      if (!isCurrent()) return;
      const pool = now.database_pool;
      replace(cards,
        card('Users', count(now.users), null, 'card-users'),
        card('Events, last 24 h', count(now.events_last_24h), null, 'card-events'),
        card('Requests / s', rate(now, previous, 'requests_total'), `${count(now.requests_total)} since start`, 'card-rps'),
        card('Errors / s (5xx)', rate(now, previous, 'server_errors_total'), `${count(now.server_errors_total)} since start`,
          'card-errors'),
        card('Database pool', `${pool.in_use} / ${pool.open}`, `in use / open, max ${pool.max}, ${pool.waiting} waiting`,
          'card-pool'),
        card('Waiting long-polls', count(now.long_polls_waiting), null, 'card-longpolls'),
        card('Schema', schema(now.schema_version),
          now.pending_migrations === 0 ? 'no migration pending' : `${now.pending_migrations} migration(s) pending`,
          'card-schema'),
        card('Server', now.version, `up ${duration(now.uptime_seconds)}`, 'card-version'));
      replace(chartArea, charts(now));
      replace(status);
      document.getElementById('refreshed').textContent =
        'refreshed ' + new Date(now.sampled_at * 1000).toISOString().slice(11, 19) + ' UTC';
      previous = now;
    } catch (error) {
      if (!isCurrent()) return;
      replace(status, notice('error', error.message));
    }
    await new Promise((resolve) => setTimeout(resolve, refreshMilliseconds));
  }
}
