// Sign-in: an address of TRUNK_SYNC_ADMIN_EMAILS, then the 6-digit code mailed to it.
import { api, ApiError } from './api.js';
import { h, notice, replace } from './dom.js';

/** Renders the sign-in forms into `main`; calls `signedIn(session)` once a code is accepted. */
export function renderSignIn(main, { enabled, signedIn }) {
  if (!enabled) {
    replace(
      main,
      h('section', { class: 'panel narrow', id: 'sign-in' },
        h('h1', {}, 'Console sign-in is disabled'),
        h('p', {}, 'No address may sign in: set ', h('code', {}, 'TRUNK_SYNC_ADMIN_EMAILS'),
          ' to the operators\u2019 email addresses (comma-separated) and restart the server.')));
    return;
  }
  const status = h('div', { class: 'status' });
  const emailInput = h('input', { type: 'email', name: 'email', id: 'email', autocomplete: 'username', required: true });
  const emailForm = h('form', { id: 'email-form', class: 'stack' },
    h('label', { for: 'email' }, 'Email address'),
    emailInput,
    h('button', { type: 'submit' }, 'Send code'));
  const codeInput = h('input', {
    name: 'code', id: 'code', autocomplete: 'one-time-code', inputmode: 'numeric', pattern: '[0-9]{6}',
    maxlength: '6', required: true,
  });
  const codeForm = h('form', { id: 'code-form', class: 'stack', hidden: true },
    h('label', { for: 'code' }, 'Code from the mail'),
    codeInput,
    h('button', { type: 'submit' }, 'Sign in'));

  emailForm.addEventListener('submit', async (event) => {
    event.preventDefault();
    const button = emailForm.querySelector('button');
    button.disabled = true;
    try {
      await api('POST', '/auth/otp', { body: { email: emailInput.value } });
      replace(status, notice('info',
        'If this address may use the console, a sign-in code is on its way. It is valid for a few minutes.'));
      codeForm.hidden = false;
      codeInput.focus();
    } catch (error) {
      replace(status, notice('error', error instanceof ApiError ? error.message : String(error)));
    } finally {
      button.disabled = false;
    }
  });

  codeForm.addEventListener('submit', async (event) => {
    event.preventDefault();
    const button = codeForm.querySelector('button');
    button.disabled = true;
    try {
      const session = await api('POST', '/auth/verify', { body: { email: emailInput.value, code: codeInput.value } });
      signedIn(session);
    } catch (error) {
      const text = error instanceof ApiError && error.code === 'otp_expired'
        ? 'That code is wrong or has expired. Ask for a new one if needed.'
        : error.message;
      replace(status, notice('error', text));
      codeInput.select();
    } finally {
      button.disabled = false;
    }
  });

  replace(
    main,
    h('section', { class: 'panel narrow', id: 'sign-in' },
      h('h1', {}, 'Sign in'),
      h('p', { class: 'muted' }, 'Operators listed in TRUNK_SYNC_ADMIN_EMAILS get a code by mail.'),
      emailForm, codeForm, status));
  emailInput.focus();
}
