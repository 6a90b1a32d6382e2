// Overview: the server's figures, refreshed every few seconds while shown.
import { api } from './api.js';
import { count, duration, h, notice, replace } from './dom.js';

const refreshMilliseconds = 5000;

function card(label, value, detail, id) {
  return h('div', { class: 'card', id },
    h('div', { class: 'label' }, label),
    h('div', { class: 'value' }, value),
    detail ? h('div', { class: 'detail' }, detail) : null);
}

function rate(now, before, field) {
  if (!before) return '—';
  const seconds = now.sampled_at - before.sampled_at;
  if (seconds <= 0) return '—';
  return ((now[field] - before[field]) / seconds).toFixed(2);
}

/** Renders the overview into `main` until `isCurrent()` turns false. */
export async function renderOverview(main, isCurrent) {
  const cards = h('div', { class: 'cards', id: 'overview-cards' });
  const status = h('div', { class: 'status' });
  replace(main,
    h('section', { class: 'panel', id: 'overview' },
      h('div', { class: 'heading' }, h('h1', {}, 'Overview'), h('span', { class: 'muted', id: 'refreshed' }, '')),
      cards, status));
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
        card('Schema', now.schema_version || 'none',
          now.pending_migrations === 0 ? 'no migration pending' : `${now.pending_migrations} migration(s) pending`,
          'card-schema'),
        card('Server', now.version, `up ${duration(now.uptime_seconds)}`, 'card-version'));
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
