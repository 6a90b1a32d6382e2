// The console's one door to the server: JSON over /admin/v1 with the session cookie
// (HttpOnly: this code never sees the token) and the header that tells the server the
// request comes from this page, not from another site.

/** An answer that was not 2xx: its status and the server's code and message. */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** Called when the server says the console session ended (401). */
let onSignedOut = () => {};
export function whenSignedOut(handler) {
  onSignedOut = handler;
}

/**
 * Sends a request to /admin/v1 + path; resolves to the parsed JSON body (null for 204), or
 * to the raw Response when `raw` is set. Rejects with ApiError.
 */
export async function api(method, path, { query, body, raw } = {}) {
  const url = new URL('/admin/v1' + path, window.location.origin);
  for (const [name, value] of Object.entries(query || {})) {
    if (value !== undefined && value !== null && value !== '') url.searchParams.set(name, String(value));
  }
  const headers = { 'X-Trunk-Sync-Console': '1', Accept: 'application/json' };
  const init = { method, headers, credentials: 'same-origin', cache: 'no-store' };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(url, init);
  } catch (error) {
    throw new ApiError(0, 'network_error', 'The server cannot be reached.');
  }
  if (response.ok) {
    if (raw) return response;
    return response.status === 204 ? null : response.json();
  }
  let code = 'http_' + response.status;
  let message = response.statusText || 'Request failed.';
  try {
    const error = await response.json();
    code = error.code || code;
    message = error.message || message;
  } catch (ignored) {
    // Not JSON: keep the status line.
  }
  if (response.status === 401 && !path.startsWith('/auth/')) onSignedOut();
  throw new ApiError(response.status, code, message);
}
