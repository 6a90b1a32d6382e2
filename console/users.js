// Users: search by address, a page at a time.
import { api } from './api.js';
import { count, h, notice, replace, time } from './dom.js';

const pageSize = 25;

/** Renders the user list for `params` (q, offset) into `main`; `go(hash)` navigates. */
export async function renderUsers(main, params, go, message) {
  const q = params.get('q') || '';
  const offset = Math.max(0, Number.parseInt(params.get('offset') || '0', 10) || 0);
  const search = h('input', { type: 'search', name: 'q', id: 'user-search', value: q, placeholder: 'part of an address' });
  const form = h('form', { class: 'inline', id: 'user-search-form' },
    h('label', { for: 'user-search' }, 'Search by email'), search, h('button', { type: 'submit' }, 'Search'));
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    go('#/users?' + new URLSearchParams({ q: search.value.trim() }).toString());
  });
  const body = h('div', {}, h('p', { class: 'muted' }, 'Loading…'));
  replace(main, h('section', { class: 'panel', id: 'users' },
    h('h1', {}, 'Users'), message ? notice('ok', message) : null, form, body));

  let page;
  try {
    page = await api('GET', '/users', { query: { q, offset, limit: pageSize } });
  } catch (error) {
    replace(body, notice('error', error.message));
    return;
  }
  if (page.users.length === 0) {
    replace(body, h('p', { class: 'muted', id: 'no-users' }, q ? `No user's address contains \u201c${q}\u201d.` : 'No users yet.'));
    return;
  }
  const rows = page.users.map((user) => h('tr', {},
    h('td', {}, h('a', { href: `#/users/${user.id}`, class: 'user-link' }, user.email)),
    h('td', {}, time(user.created_at)),
    h('td', {}, time(user.last_sign_in_at)),
    h('td', { class: 'number' }, count(user.events)),
    h('td', { class: 'number' }, count(user.active_sessions))));
  const link = (label, to, id) => h('a', { class: 'button quiet', href: to, id }, label);
  const query = (newOffset) => '#/users?' + new URLSearchParams({ q, offset: String(newOffset) }).toString();
  const end = offset + page.users.length;
  replace(body,
    h('table', { id: 'user-table' },
      h('thead', {}, h('tr', {},
        h('th', {}, 'Email'), h('th', {}, 'Created'), h('th', {}, 'Last sign-in'),
        h('th', { class: 'number' }, 'Events'), h('th', { class: 'number' }, 'Active sessions'))),
      h('tbody', {}, rows)),
    h('div', { class: 'pager' },
      offset > 0 ? link('\u2190 Previous', query(Math.max(0, offset - pageSize)), 'users-previous') : null,
      h('span', { class: 'muted' }, `${offset + 1}\u2013${end} of ${count(page.total)}`),
      end < page.total ? link('Next \u2192', query(end), 'users-next') : null));
}
