// One user: profile, sessions (revoke), events (filters, pages), export and deletion.
import { api } from './api.js';
import { count, h, localToUTC, notice, replace, time } from './dom.js';

const eventPage = 50;

/** Renders user `id` into `main`; `go(hash, message)` navigates. */
export async function renderUser(main, id, go) {
  const status = h('div', { class: 'status', id: 'user-status' });
  replace(main, h('section', { class: 'panel' }, h('p', { class: 'muted' }, 'Loading…')));
  let detail;
  try {
    detail = await api('GET', `/users/${encodeURIComponent(id)}`);
  } catch (error) {
    replace(main, h('section', { class: 'panel' }, h('h1', {}, 'User'), notice('error', error.message),
      h('p', {}, h('a', { href: '#/users' }, '\u2190 All users'))));
    return;
  }
  const user = detail.user;
  const sessions = h('div', { id: 'sessions' });
  const events = h('div', { id: 'events' });
  replace(main,
    h('section', { class: 'panel', id: 'user' },
      h('p', {}, h('a', { href: '#/users' }, '\u2190 All users')),
      h('div', { class: 'heading' }, h('h1', { id: 'user-email' }, user.email), actions(user, status, go)),
      status,
      profile(user, detail.user_metadata)),
    h('section', { class: 'panel' }, h('h2', {}, 'Sessions'), sessions),
    h('section', { class: 'panel' }, h('h2', {}, 'Events'), events));
  await Promise.all([renderSessions(sessions, user, status), renderEvents(events, user, detail.event_types)]);
}

function profile(user, metadata) {
  const row = (label, value, id) => [h('dt', {}, label), h('dd', { id }, value)];
  return h('dl', { class: 'profile' },
    row('User id', h('code', {}, user.id)),
    row('Name', user.full_name || '—'),
    row('Created', time(user.created_at)),
    row('Last sign-in', time(user.last_sign_in_at)),
    row('Last event', time(user.last_event_at)),
    row('Events', count(user.events), 'profile-events'),
    row('Active sessions', count(user.active_sessions), 'profile-sessions'),
    row('User metadata', h('pre', { class: 'json' }, JSON.stringify(metadata, null, 2))));
}

/**
 * The event lines of a whole export: the account's line, then event lines, then the end line
 * `{"kind":"end","events":N,"last_seq":S}`, which the server writes only once every event is
 * written. A body cut short where the break did not show (a proxy that closed the connection
 * instead) has no end line, or one that does not match what came: it is refused, not saved.
 */
function exportedEvents(text) {
  const incomplete = (why) => new Error(`The export is incomplete (${why}); nothing was saved. Export again.`);
  const parse = (line) => {
    try {
      return JSON.parse(line);
    } catch (ignored) {
      return null;
    }
  };
  const lines = text.split('\n');
  if (lines.pop() !== '') throw incomplete('it stops in the middle of a line');
  if (!lines[0]?.startsWith('{"kind":"account",')) throw incomplete('it does not start with the account');
  const end = lines.length > 1 && lines.at(-1).startsWith('{"kind":"end",') ? parse(lines.at(-1)) : null;
  if (!end) throw incomplete('it has no end line');
  const events = lines.slice(1, -1);
  if (!events.every((line) => line.startsWith('{"kind":"event",'))) throw incomplete('a line is not an event');
  const lastSeq = events.length ? parse(events.at(-1))?.seq : 0;
  if (end.events !== events.length || end.last_seq !== lastSeq) {
    throw incomplete(`its end line says ${end.events} event(s) up to seq ${end.last_seq}; ` +
      `${events.length} came, up to seq ${lastSeq}`);
  }
  return events.length;
}

function actions(user, status, go) {
  const exportButton = h('button', { type: 'button', class: 'quiet', id: 'export' }, 'Export events');
  exportButton.addEventListener('click', async () => {
    exportButton.disabled = true;
    try {
      const response = await api('GET', `/users/${user.id}/export`, { raw: true });
      const blob = await response.blob();
      const events = exportedEvents(await blob.text());
      const link = h('a', { href: URL.createObjectURL(blob), download: `trunk-sync-${user.id}.jsonl` });
      document.body.append(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(link.href), 60000);
      replace(status, notice('ok', `Exported the account and ${count(events)} event(s) as JSON lines.`));
    } catch (error) {
      replace(status, notice('error', error.message));
    } finally {
      exportButton.disabled = false;
    }
  });

  const confirmInput = h('input', { type: 'email', id: 'confirm-email', autocomplete: 'off', required: true });
  const deleteConfirm = h('button', { type: 'submit', class: 'danger', id: 'confirm-delete', disabled: true },
    'Delete permanently');
  confirmInput.addEventListener('input', () => {
    deleteConfirm.disabled = confirmInput.value.trim().toLowerCase() !== user.email.toLowerCase();
  });
  const confirmForm = h('form', { class: 'confirm stack', id: 'delete-form', hidden: true },
    h('p', {}, `This deletes ${user.email}, their ${count(user.events)} event(s) and every session, and signs them out `
      + 'everywhere. It cannot be undone.'),
    h('label', { for: 'confirm-email' }, 'Type the user\u2019s email address to confirm'),
    confirmInput, deleteConfirm);
  confirmForm.addEventListener('submit', async (event) => {
    event.preventDefault();
    deleteConfirm.disabled = true;
    try {
      const result = await api('DELETE', `/users/${user.id}`, { body: { confirm_email: confirmInput.value.trim() } });
      go('#/users', `Deleted ${user.email} with ${count(result.events)} event(s).`);
    } catch (error) {
      replace(status, notice('error', error.message));
      deleteConfirm.disabled = false;
    }
  });
  const deleteButton = h('button', { type: 'button', class: 'danger quiet', id: 'delete' }, 'Delete user\u2026');
  deleteButton.addEventListener('click', () => {
    confirmForm.hidden = !confirmForm.hidden;
    if (!confirmForm.hidden) confirmInput.focus();
  });
  return h('div', { class: 'actions' }, exportButton, deleteButton, confirmForm);
}

async function renderSessions(container, user, status) {
  let list;
  try {
    list = await api('GET', `/users/${user.id}/sessions`);
  } catch (error) {
    replace(container, notice('error', error.message));
    return;
  }
  if (list.sessions.length === 0) {
    replace(container, h('p', { class: 'muted' }, 'No sessions.'));
    return;
  }
  const rows = list.sessions.map((session) => {
    const revoke = session.active
      ? h('button', { type: 'button', class: 'quiet revoke', 'data-session': session.id }, 'Revoke')
      : null;
    if (revoke) {
      revoke.addEventListener('click', async () => {
        revoke.disabled = true;
        try {
          await api('DELETE', `/users/${user.id}/sessions/${session.id}`);
          replace(status, notice('ok', `Session ${session.id} revoked: its tokens are refused from now on.`));
          await renderSessions(container, user, status);
        } catch (error) {
          replace(status, notice('error', error.message));
          revoke.disabled = false;
        }
      });
    }
    return h('tr', { 'data-session-row': session.id },
      h('td', {}, h('code', {}, session.id.slice(0, 8))),
      h('td', {}, time(session.created_at)),
      h('td', {}, time(session.refreshed_at)),
      h('td', {}, session.ip || '—'),
      h('td', { class: 'agent' }, session.user_agent || '—'),
      h('td', {}, session.active ? h('span', { class: 'tag live' }, 'active') : `revoked ${time(session.revoked_at)}`),
      h('td', {}, revoke));
  });
  replace(container, h('table', { id: 'session-table' },
    h('thead', {}, h('tr', {},
      h('th', {}, 'Session'), h('th', {}, 'Started'), h('th', {}, 'Last refresh'), h('th', {}, 'Address'),
      h('th', {}, 'Client'), h('th', {}, 'State'), h('th', {}, ''))),
    h('tbody', {}, rows)));
}

async function renderEvents(container, user, types) {
  const typeSelect = h('select', { id: 'event-type', name: 'type' },
    h('option', { value: '' }, 'any type'), types.map((type) => h('option', { value: type }, type)));
  const from = h('input', { type: 'datetime-local', id: 'event-from', name: 'from', step: '1' });
  const to = h('input', { type: 'datetime-local', id: 'event-to', name: 'to', step: '1' });
  const form = h('form', { class: 'inline', id: 'event-filter' },
    h('label', { for: 'event-type' }, 'Type'), typeSelect,
    h('label', { for: 'event-from' }, 'From'), from,
    h('label', { for: 'event-to' }, 'To'), to,
    h('button', { type: 'submit' }, 'Apply'));
  const list = h('div', { id: 'event-list' });
  const pager = h('div', { class: 'pager' });
  replace(container, form, list, pager);

  const load = async (before) => {
    const filter = { type: typeSelect.value, from: localToUTC(from.value), to: localToUTC(to.value) };
    let page;
    try {
      page = await api('GET', `/users/${user.id}/events`, { query: { ...filter, before, limit: eventPage } });
    } catch (error) {
      replace(list, notice('error', error.message));
      replace(pager);
      return;
    }
    if (page.events.length === 0) {
      replace(list, h('p', { class: 'muted', id: 'no-events' }, 'No events match.'));
    } else {
      replace(list, page.events.map((event) => h('article', { class: 'event', 'data-seq': event.seq },
        h('header', {},
          h('span', { class: 'seq' }, `#${event.seq}`),
          h('span', { class: 'tag' }, event.type),
          h('span', { class: 'muted' }, `stored ${time(event.created_at)}`),
          h('span', { class: 'muted' }, `recorded ${time(event.client_timestamp)}`)),
        h('pre', { class: 'json' }, JSON.stringify(event.payload, null, 2)))));
    }
    const newest = h('button', { type: 'button', class: 'quiet', id: 'events-newest' }, 'Newest');
    newest.addEventListener('click', () => load(undefined));
    const older = h('button', { type: 'button', class: 'quiet', id: 'events-older' }, 'Older \u2192');
    older.addEventListener('click', () => load(page.next_before));
    replace(pager, before ? newest : null, page.has_more ? older : null);
  };
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    load(undefined);
  });
  await load(undefined);
}
