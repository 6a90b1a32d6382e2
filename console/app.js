// The console: which view the address (#/…) names, and whether someone is signed in.
import { api, ApiError, whenSignedOut } from './api.js';
import { h, replace } from './dom.js';
import { renderOverview } from './overview.js';
import { renderSignIn } from './signin.js';
import { renderUser } from './user.js';
import { renderUsers } from './users.js';

const main = document.getElementById('main');
const nav = document.getElementById('nav');
const who = document.getElementById('who');
const signOutButton = document.getElementById('sign-out');

/** A user's address in the page (#/users/<id>): a UUID and nothing else, so a link cannot make
 * the page request another path (`..`) or fail on a malformed escape. */
const userID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

let session = null;
let enabled = false;
/** Bumped on every navigation: views that outlive theirs (the overview's refresh) stop. */
let generation = 0;
/** A message for the next view (after a deletion). */
let pendingMessage = null;

function showSignedIn(current) {
  session = current;
  nav.hidden = !current;
  signOutButton.hidden = !current;
  who.textContent = current ? current.email : '';
}

function go(hash, message) {
  pendingMessage = message || null;
  if (window.location.hash === hash) route();
  else window.location.hash = hash;
}

async function route() {
  const mine = ++generation;
  const isCurrent = () => mine === generation;
  if (!session) {
    renderSignIn(main, {
      enabled,
      signedIn: (current) => {
        showSignedIn(current);
        route();
      },
    });
    return;
  }
  const hash = window.location.hash || '#/';
  const [path, query] = hash.slice(1).split('?');
  const params = new URLSearchParams(query || '');
  const message = pendingMessage;
  pendingMessage = null;
  const parts = path.split('/').filter((part) => part !== '');
  for (const link of nav.querySelectorAll('a')) {
    link.classList.toggle('current', link.dataset.view === (parts[0] === 'users' ? 'users' : 'overview'));
  }
  if (parts.length === 0) {
    await renderOverview(main, isCurrent);
  } else if (parts[0] === 'users' && parts.length === 1) {
    await renderUsers(main, params, go, message);
  } else if (parts[0] === 'users' && parts.length === 2 && userID.test(parts[1])) {
    await renderUser(main, parts[1].toLowerCase(), go);
  } else {
    replace(main, h('section', { class: 'panel' }, h('h1', {}, 'Not found'),
      h('p', {}, h('a', { href: '#/' }, 'Overview'))));
  }
}

// The console's other tabs (one cookie, one session): when one learns the session ended (its
// sign-out, or a 401), they all show the sign-in page, so no tab left open keeps showing
// users' data after the operator signed out.
const tabs = typeof BroadcastChannel === 'function' ? new BroadcastChannel('trunk-sync-console') : null;

function signedOut({ tell }) {
  if (tell) tabs?.postMessage('signed-out');
  if (!session) return;
  showSignedIn(null);
  route();
}

tabs?.addEventListener('message', (event) => {
  if (event.data === 'signed-out') signedOut({ tell: false });
});

whenSignedOut(() => signedOut({ tell: true }));

// Signed out only once the server ended the session (or says it had ended): a sign-out that
// did not reach it leaves the session live and its cookie in the browser, so the page says
// so and stays as it is, instead of looking signed out while a reload would sign in again.
signOutButton.addEventListener('click', async () => {
  signOutButton.disabled = true;
  try {
    await api('POST', '/auth/logout');
  } catch (error) {
    if (!(error instanceof ApiError && error.status === 401)) {
      document.getElementById('sign-out-failed')?.remove();
      main.prepend(h('p', { class: 'notice error', role: 'alert', id: 'sign-out-failed' },
        `Not signed out: ${error.message} The session is still live; try again.`));
      return;
    }
  } finally {
    signOutButton.disabled = false;
  }
  signedOut({ tell: true });
});

window.addEventListener('hashchange', route);

async function start() {
  try {
    const state = await api('GET', '/session');
    enabled = state.sign_in_enabled;
    showSignedIn(state.signed_in ? { email: state.email, expires_at: state.expires_at } : null);
  } catch (error) {
    replace(main, h('p', { class: 'notice error', role: 'alert' }, error.message));
    return;
  }
  route();
}

start();
