// trunk-sync's browser client: sign-in with a mailed code, a durable outbox in IndexedDB,
// batched push, paged pull and live events over Server-Sent Events, one leader tab per
// account. Dependency-free ES module; types in trunk-sync.d.ts; guide in docs/web-client.md.
//
//   import { TrunkSyncClient } from 'https://sync.example.com/client/v1/trunk-sync.js';

const VERSION = 1;
const MAX_PAYLOAD_BYTES = 64 * 1024;
const SERVER_MAX_BATCH_EVENTS = 1000;
/** The most events the server returns in one page of a pull (`limit`). */
const SERVER_MAX_PAGE = 1000;
const SERVER_MAX_BATCH_BYTES = 10 * 1024 * 1024;
/**
 * The most characters one live stream message may take: the server's largest (a 64 KiB
 * payload, escaped) is far below; a stream past it is not the server's.
 */
const MAX_STREAM_MESSAGE = 2 * 1024 * 1024;

/** What the client throws: `code` says which failure (see trunk-sync.d.ts). */
export class TrunkSyncError extends Error {
  /**
   * @param {string} code
   * @param {string} message
   * @param {{status?: number, details?: unknown, retryAfter?: number, fromServer?: boolean}} [extra]
   */
  constructor(code, message, extra = {}) {
    super(message);
    this.name = 'TrunkSyncError';
    this.code = code;
    this.status = extra.status ?? 0;
    this.details = extra.details;
    this.retryAfter = extra.retryAfter;
    /** The answer was the server's own error (its JSON), not a page of something in between. */
    this.fromServer = extra.fromServer ?? false;
  }
}

// MARK: - Pure parts (exported for tests)

/**
 * The wait in ms before try `attempt + 1` (from 0) without Retry-After: random between 0 and
 * min(maxDelay, baseDelay · 2^attempt) ("full jitter").
 * @param {number} attempt @param {{baseDelay: number, maxDelay: number}} policy
 * @param {() => number} [random]
 */
export function backoffDelay(attempt, policy, random = Math.random) {
  const cap = Math.min(policy.maxDelay, policy.baseDelay * 2 ** Math.min(attempt, 30));
  return random() * cap;
}

/**
 * A Retry-After header in ms (seconds or an HTTP date), or null when absent or unreadable. A
 * date is counted from the answer's own `Date` header (`date`: the same clock) when it has a
 * readable one, not from this device's clock, which may be off by hours (waiting hours for a
 * pause of seconds, or not at all); else from `now`.
 * @param {string | null | undefined} value @param {string | null | undefined} [date]
 * @param {number} [now]
 */
export function parseRetryAfter(value, date = null, now = Date.now()) {
  if (value == null) return null;
  const text = String(value).trim();
  if (/^\d+$/.test(text)) return Number(text) * 1000;
  const until = httpDate(text);
  return until === null ? null : Math.max(0, until - (httpDate(date) ?? now));
}

/**
 * An HTTP date ("Thu, 26 Nov 2026 12:00:00 GMT") in ms since the epoch, or null.
 * @param {string | null | undefined} value
 */
function httpDate(value) {
  const text = String(value ?? '').trim();
  if (!/^[A-Za-z]{3}, /.test(text)) return null;
  const date = Date.parse(text);
  return Number.isNaN(date) ? null : date;
}

/**
 * The wait a Retry-After of `ms` asks for: exactly that, plus up to 10 % jitter.
 * @param {number} ms @param {() => number} [random]
 */
export function retryAfterDelay(ms, random = Math.random) {
  return ms + random() * ms * 0.1;
}

/**
 * The first batch of `records` (oldest first) within `maxEvents` and `maxBytes` of payload
 * (each record's `bytes`); at least one record when there is any.
 * @template {{bytes: number}} T
 * @param {T[]} records @param {{maxEvents: number, maxBytes: number}} limits
 * @returns {T[]}
 */
export function firstBatch(records, limits) {
  const batch = [];
  let bytes = 0;
  for (const record of records) {
    if (batch.length >= limits.maxEvents) break;
    if (batch.length > 0 && bytes + record.bytes > limits.maxBytes) break;
    batch.push(record);
    bytes += record.bytes;
  }
  return batch;
}

/** Bytes of a string as UTF-8. @param {string} text */
export function utf8Length(text) {
  return new TextEncoder().encode(text).length;
}

/**
 * Server-Sent Events framing (the WHATWG rules): feed text as it arrives, get each complete
 * message `{id, event, data}` (`id` is the last id seen, as EventSource keeps it) and the
 * server's `retry` hint.
 */
export class SSEParser {
  /**
   * Characters of the message being read (its data lines, the line not ended yet): a
   * reader caps it (`MAX_STREAM_MESSAGE`), so a stream that never ends a line cannot hold it.
   */
  get pending() {
    return this.buffer.length + this.data.reduce((sum, line) => sum + line.length, 0);
  }

  constructor() {
    this.buffer = '';
    this.data = [];
    this.event = '';
    this.lastEventId = '';
    /** @type {number | null} */
    this.retry = null;
    this.sawData = false;
    this.skipLF = false;
  }

  /** @param {string} text @returns {{id: string, event: string, data: string}[]} */
  push(text) {
    // A \r that ended the last chunk ended a line; a \n right after it belongs to it (and
    // only that one \n: the wait ends with the first character that comes).
    if (this.skipLF && text.length > 0) {
      if (text.startsWith('\n')) text = text.slice(1);
      this.skipLF = false;
    }
    this.buffer += text;
    const messages = [];
    for (;;) {
      const match = /\r\n|\r|\n/.exec(this.buffer);
      if (!match) break;
      if (match[0] === '\r' && match.index === this.buffer.length - 1) this.skipLF = true;
      const line = this.buffer.slice(0, match.index);
      this.buffer = this.buffer.slice(match.index + match[0].length);
      const message = this.line(line);
      if (message) messages.push(message);
    }
    return messages;
  }

  /** @param {string} line */
  line(line) {
    if (line === '') {
      if (!this.sawData) {
        this.event = '';
        return null;
      }
      const message = { id: this.lastEventId, event: this.event || 'message', data: this.data.join('\n') };
      this.data = [];
      this.event = '';
      this.sawData = false;
      return message;
    }
    if (line.startsWith(':')) return null;
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'data') {
      this.data.push(value);
      this.sawData = true;
    } else if (field === 'event') this.event = value;
    else if (field === 'id' && !value.includes('\0')) this.lastEventId = value;
    else if (field === 'retry' && /^\d+$/.test(value)) this.retry = Number(value);
    return null;
  }
}

/**
 * Whether an error answer's body (parsed JSON, or null) is the server's own error: an object
 * with a string `code` (`/sync/v1`) or `error_code` (`/auth/v1`). A page of something in
 * between (a proxy's, a captive portal's HTML, a load balancer's JSON of its own) is not,
 * and must not be taken for the server's refusal of a session or of an event.
 * @param {any} body
 */
export function isServerError(body) {
  return isPlainObject(body) && (typeof body.code === 'string' || typeof body.error_code === 'string');
}

/**
 * The indexes of the events of a batch of `count` a `400 validation_failed` names, with their
 * first problem. An index outside the batch names none of its events (an answer not about
 * this batch: it is halved as for one that names none, never pushed again as it is). Only
 * the server's own 400 gets here (isServerError): a page of something in the way fails the
 * push.
 * @param {any} body @param {number} count @returns {Map<number, {field: string, reason: string}>}
 */
export function refusedEvents(body, count) {
  const refused = new Map();
  if (!body || !Array.isArray(body.details)) return refused;
  for (const problem of body.details) {
    const index = problem?.index;
    if (Number.isInteger(index) && index >= 0 && index < count && !refused.has(index)) {
      refused.set(index, { field: String(problem.field ?? ''), reason: String(problem.reason ?? '') });
    }
  }
  return refused;
}

/**
 * What a push answer says of each event: `client_id` → `'created'` or `'duplicate'`, only for
 * results that name one of those; null when the body is not a push answer at all.
 * @param {any} body @returns {Map<string, 'created' | 'duplicate'> | null}
 */
export function pushResults(body) {
  if (!body || typeof body !== 'object' || !Array.isArray(body.results)) return null;
  const stored = new Map();
  for (const result of body.results) {
    if (!result || typeof result.client_id !== 'string') continue;
    if (result.status === 'created' || result.status === 'duplicate') stored.set(result.client_id, result.status);
  }
  return stored;
}

/**
 * A pull answer for `cursor` as the client relies on it: events in increasing `seq` order,
 * all after `cursor`, a `next_after` not behind the last of them (nor behind `cursor`), and
 * past `cursor` when it says `has_more` (else the pull would ask for the same page forever).
 * Anything else (a proxy's page, a stale or broken answer) is `invalid_response`: it reaches
 * no handler and never moves the cursor back.
 * @param {any} page @param {number} cursor
 * @returns {{events: any[], next_after: number, has_more: boolean}}
 */
export function checkedPage(page, cursor) {
  const invalid = (/** @type {string} */ why) =>
    new TrunkSyncError('invalid_response', `the pull answer after ${cursor} is not the server's: ${why}`);
  if (!page || !Array.isArray(page.events) || !Number.isSafeInteger(page.next_after)) {
    throw invalid('no events and next_after');
  }
  let previous = cursor;
  for (const event of page.events) {
    if (!event || !Number.isSafeInteger(event.seq) || event.seq <= previous) {
      throw invalid(`seq ${event?.seq} after ${previous}`);
    }
    previous = event.seq;
  }
  if (page.next_after < previous) throw invalid(`next_after ${page.next_after} behind ${previous}`);
  if (page.has_more === true && page.next_after <= cursor) throw invalid('has_more without moving past the cursor');
  return { events: page.events, next_after: page.next_after, has_more: page.has_more === true };
}

/**
 * Why an outbox record cannot be sent as an event, or null when it can: a `client_id`,
 * `type` or `client_timestamp` that is not a string, a `payload` that is not a plain object
 * or (with `serialize`, the default) has no JSON form (a BigInt, a cycle). `record` writes
 * none of these; another version of the app, an extension or a damaged profile can. Such a
 * record is set aside to the quarantine as it is (see `setAside`), never sent, never dropped.
 * @param {any} record @param {boolean} [serialize] @returns {string | null}
 */
export function outboxProblem(record, serialize = true) {
  if (!record || typeof record !== 'object') return 'not an object';
  for (const field of ['client_id', 'type', 'client_timestamp']) {
    if (typeof record[field] !== 'string') return `its ${field} is not a string`;
  }
  if (!isPlainObject(record.payload)) return 'its payload is not a plain object';
  if (serialize) {
    try {
      JSON.stringify(record.payload);
    } catch (error) {
      return `its payload has no JSON form (${error instanceof Error ? error.message : String(error)})`;
    }
  }
  return null;
}

/**
 * Whether an IndexedDB read failed for the record itself, whose value the browser cannot
 * read: Chrome keeps a value over its wrapping threshold (~64 KiB: an event near the payload
 * limit) in a file of its own under the profile's `*.indexeddb.blob` directory, and that
 * file lost (disk clean-up, a profile copied without it) fails the read with
 * `NotReadableError` ("Data lost due to missing file"; `NotFoundError` in Chrome 12x–129),
 * damaged or not readable now with `UnknownError` ("Failed to read large IndexedDB value");
 * older versions say `DataError` (see `valueLost`). A read of many records
 * (`getAll`) fails as a whole for one of them. Anything else (the database closed, the
 * transaction aborted, the quota) is not the record's.
 * @param {unknown} error @returns {boolean}
 */
export function unreadableValue(error) {
  const name = errorName(error);
  return valueLost(error) || name === 'UnknownError' || name === 'DataError';
}

/**
 * Whether a read that failed for its record (`unreadableValue`) says the value is gone for
 * good: its file is missing, `NotReadableError` ("Data lost due to missing file. Affected
 * record should be considered irrecoverable"; `NotFoundError` in Chrome 12x–129). Chrome
 * reports its other failures to read a large value (a file it could not read, cut short)
 * as `UnknownError`, "since these are internal, likely transient, errors" (its source's
 * words), and older versions every failure as `DataError`: such a record may read again.
 * @param {unknown} error @returns {boolean}
 */
export function valueLost(error) {
  const name = errorName(error);
  return name === 'NotReadableError' || name === 'NotFoundError';
}

/** @param {unknown} error @returns {unknown} */
function errorName(error) {
  return error && typeof error === 'object' && 'name' in error ? error.name : '';
}

/**
 * Reads each of `keys` with `read` (the caller's: one transaction each, since Chrome aborts a
 * transaction in which a value could not be read, whatever the page does), all at once, and
 * once more those that failed: a value that fails twice with `unreadableValue` is
 * unreadable; one that fails with anything else rejects with that error. The values in the
 * order of `keys` (an `undefined` one, the record gone meanwhile, left out) and the
 * unreadable records' keys with the browser's error.
 * @param {IDBValidKey[]} keys @param {(key: IDBValidKey) => Promise<unknown>} read
 * @returns {Promise<{values: any[], unreadable: {key: IDBValidKey, error: unknown}[]}>}
 */
export async function readEach(keys, read) {
  /**
   * @param {IDBValidKey} key
   * @returns {Promise<{key: IDBValidKey, value?: unknown, error?: unknown, failed: boolean}>}
   */
  const attempt = (key) =>
    read(key).then(
      (value) => ({ key, value, failed: false }),
      (error) => ({ key, error, failed: true }),
    );
  const first = await Promise.all(keys.map(attempt));
  const again = await Promise.all(first.map((result) => (result.failed ? attempt(result.key) : result)));
  /** @type {any[]} */
  const values = [];
  /** @type {{key: IDBValidKey, error: unknown}[]} */
  const unreadable = [];
  for (const result of again) {
    if (!result.failed) {
      if (result.value !== undefined) values.push(result.value);
    } else if (unreadableValue(result.error)) {
      unreadable.push({ key: result.key, error: result.error });
    } else {
      throw result.error;
    }
  }
  return { values, unreadable };
}

/**
 * What the quarantine holds, or lists, for a record the browser cannot read
 * (`unreadableValue`): its bytes are gone, so it holds no event, only where it was and
 * the browser's error: field `unreadable`, an empty `type`, `payload` and
 * `client_timestamp`. For the outbox's record `key` (stored, under `unreadable-<key>`, with
 * `outbox_key`); for a quarantine entry (listed under its own key, `quarantined_at` empty;
 * its `reason` says whether its content is lost, or it may be readable again later).
 * @param {'outbox' | 'quarantine'} store @param {IDBValidKey} key @param {unknown} error
 * @param {string} now
 */
export function unreadableEntry(store, key, error, now) {
  const named = error && typeof error === 'object' && 'name' in error ? /** @type {Error} */ (error) : null;
  const cause = named ? `${named.name}: ${named.message}` : String(error);
  const what = store === 'outbox' ? `outbox record ${String(key)}` : 'this quarantine entry';
  const entry = {
    client_id: store === 'outbox' ? `unreadable-${String(key)}` : key,
    type: '',
    payload: {},
    client_timestamp: '',
    field: 'unreadable',
    // The outbox's is gone from there; a quarantine entry whose read failed for a reason
    // the browser does not say is for good (see valueLost) is still stored, and may read
    // again: not to be discarded in haste.
    reason: `the browser cannot read ${what} (${cause}): ${
      store === 'outbox' || valueLost(error) ? 'its content is lost' : 'it may be readable again later'
    }`,
    quarantined_at: store === 'outbox' ? now : '',
  };
  return store === 'outbox' ? { ...entry, outbox_key: key } : entry;
}

/**
 * A stored cursor (`meta` `cursor` or `live`): a seq, or undefined when there is none or what
 * is there is not one (written by something else): then the pull starts from the beginning
 * (delivery is at least once: the app skips seqs it applied) instead of asking the server
 * for a cursor it refuses, every sync, for good.
 * @param {unknown} value @returns {number | undefined}
 */
export function storedSeq(value) {
  return Number.isSafeInteger(value) && /** @type {number} */ (value) >= 0 ? /** @type {number} */ (value) : undefined;
}

/**
 * The event a live stream message's `data` carries, or null when it is not one (not JSON, not
 * an object, no integer `seq`): a message cut short or mangled on the way.
 * @param {string} data @returns {any}
 */
export function streamEvent(data) {
  let event;
  try {
    event = JSON.parse(data);
  } catch {
    return null;
  }
  return isPlainObject(event) && Number.isSafeInteger(event.seq) ? event : null;
}

const EXPORT_PREFIXES = Object.fromEntries(
  ['account', 'event', 'end'].map((kind) => [kind, new TextEncoder().encode(`{"kind":"${kind}",`)]),
);

/**
 * Follows an export's body (`GET /sync/v1/export`) piece by piece and tells whether it is
 * whole: the account's line first, then event lines, then the end line
 * `{"kind":"end","events":N,"last_seq":S}` that the server writes only once every event is
 * written (N: the event lines before it, S: the last one's `seq`, 0 when none), and nothing
 * after it. A body cut short where the break did not show (a proxy that ends it by closing
 * the connection) has no end line, or one that does not match what came, and one put
 * together wrong (a page missing and another repeated: the count the same) has event lines
 * whose `seq`s do not increase: `incomplete_export`. Each line is known by how it starts
 * (the server writes the kind first); of an event line only its `seq` is read (`exportSeq`:
 * the server writes it among the first members, before the payload), only the end line is
 * read as JSON.
 */
export class ExportCheck {
  constructor() {
    /** Whole lines read. */
    this.lines = 0;
    /** Event lines read. */
    this.events = 0;
    /** @type {Uint8Array[]} the pieces of the line being read */
    this.partial = [];
    /** The last event line's seq, 0 before one. */
    this.lastSeq = 0;
    /** @type {{events: number, last_seq: number} | null} */
    this.end = null;
  }

  /**
   * Reads the next piece of the body; throws `incomplete_export` as soon as it cannot be a
   * whole export.
   * @param {Uint8Array} piece
   */
  push(piece) {
    let start = 0;
    for (let newline = piece.indexOf(10); newline >= 0; newline = piece.indexOf(10, start)) {
      let line = piece.subarray(start, newline);
      if (this.partial.length > 0) {
        const pieces = [...this.partial, line];
        line = new Uint8Array(pieces.reduce((length, part) => length + part.length, 0));
        let offset = 0;
        for (const part of pieces) {
          line.set(part, offset);
          offset += part.length;
        }
        this.partial = [];
      }
      this.line(line);
      start = newline + 1;
    }
    if (start < piece.length) {
      if (this.end) throw incompleteExport('the body goes on after its end line');
      this.partial.push(piece.slice(start));
    }
  }

  /**
   * What the end line says, once the body has ended; throws `incomplete_export` when it is
   * not a whole export.
   * @returns {{events: number, last_seq: number}}
   */
  finish() {
    if (this.partial.length > 0) {
      throw incompleteExport(`the body stops in the middle of line ${this.lines + 1} (${this.events} event line(s) before)`);
    }
    if (this.lines === 0) throw incompleteExport('the body is empty');
    if (!this.end) throw incompleteExport(`the body has no end line: ${this.events} event line(s) came, then nothing more`);
    if (this.end.events !== this.events) {
      throw incompleteExport(`the end line counts ${this.end.events} event line(s), but ${this.events} came`);
    }
    if (this.end.last_seq !== this.lastSeq) {
      throw incompleteExport(`the end line says the last seq is ${this.end.last_seq}, but it is ${this.lastSeq}`);
    }
    return this.end;
  }

  /** @param {Uint8Array} bytes */
  line(bytes) {
    this.lines += 1;
    const startsWith = (/** @type {Uint8Array} */ prefix) =>
      bytes.length >= prefix.length && prefix.every((byte, index) => bytes[index] === byte);
    if (this.end) throw incompleteExport('the body goes on after its end line');
    if (this.lines === 1) {
      if (!startsWith(EXPORT_PREFIXES.account)) throw incompleteExport("the body's first line is not the account");
    } else if (startsWith(EXPORT_PREFIXES.event)) {
      const seq = exportSeq(bytes, `line ${this.lines}`);
      if (seq <= this.lastSeq) {
        throw incompleteExport(
          `line ${this.lines} has seq ${seq} after ${this.lastSeq}: the event lines are not in seq order`,
        );
      }
      this.events += 1;
      this.lastSeq = seq;
    } else if (startsWith(EXPORT_PREFIXES.end)) {
      const { events, last_seq } = exportIntegers(bytes, ['events', 'last_seq'], 'the end line');
      this.end = { events, last_seq };
    } else {
      throw incompleteExport(`line ${this.lines} is neither an event nor the end line`);
    }
  }
}

/** @param {string} why */
function incompleteExport(why) {
  return new TrunkSyncError('incomplete_export', `the export is incomplete: ${why}; not handed out as the copy`);
}

const QUOTE = 34;
const BACKSLASH = 92;
const SEQ_KEY = new TextEncoder().encode('"seq"');

/**
 * The `seq` of an export's event line (`bytes`, `{"kind":"event",…}`), reading only the
 * members up to it: the server writes it second (`"id":"…","seq":N,…`), so the payload is
 * not looked at. Where the line is not as the server writes it (`seq` after a member that is
 * not a string, not a plain integer, not there) the whole line is read as JSON
 * (`exportIntegers`), which says `incomplete_export` if it cannot be read. `what`: the line,
 * for the message.
 * @param {Uint8Array} bytes @param {string} what @returns {number}
 */
export function exportSeq(bytes, what) {
  let at = EXPORT_PREFIXES.event.length;
  /** The end of the JSON string starting at `at` (its closing quote's index + 1), or -1. */
  const stringEnd = (/** @type {number} */ start) => {
    if (bytes[start] !== QUOTE) return -1;
    for (let i = start + 1; i < bytes.length; i++) {
      if (bytes[i] === BACKSLASH) i++;
      else if (bytes[i] === QUOTE) return i + 1;
    }
    return -1;
  };
  for (let member = 0; member < 4; member++) {
    const keyEnd = stringEnd(at);
    if (keyEnd < 0 || bytes[keyEnd] !== 58 /* : */) break;
    const isSeq = keyEnd - at === SEQ_KEY.length && SEQ_KEY.every((byte, index) => bytes[at + index] === byte);
    at = keyEnd + 1;
    if (isSeq) {
      let end = at;
      while (end < bytes.length && bytes[end] >= 48 && bytes[end] <= 57) end++;
      const next = bytes[end];
      // Digits only (no sign, fraction or exponent), not 0-led, then the next member or the end.
      if (end > at && end - at <= 16 && (bytes[at] !== 48 || end - at === 1) && (next === 44 || next === 125)) {
        const seq = Number(new TextDecoder().decode(bytes.subarray(at, end)));
        if (Number.isSafeInteger(seq)) return seq;
      }
      break;
    }
    const valueEnd = stringEnd(at); // the members before it are strings (the id)
    if (valueEnd < 0 || bytes[valueEnd] !== 44 /* , */) break;
    at = valueEnd + 1;
  }
  return exportIntegers(bytes, ['seq'], `the event line (${what})`).seq;
}

/**
 * The members `keys` of the JSON object in `bytes`, each a whole number of at least 0, or
 * `incomplete_export` (`what`: the line, for the message).
 * @param {Uint8Array} bytes @param {string[]} keys @param {string} what
 * @returns {Record<string, number>}
 */
function exportIntegers(bytes, keys, what) {
  let object;
  try {
    object = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(bytes));
  } catch {
    object = null;
  }
  const valid = (/** @type {unknown} */ value) => Number.isSafeInteger(value) && /** @type {number} */ (value) >= 0;
  if (!isPlainObject(object) || !keys.every((key) => valid(object[key]))) {
    throw incompleteExport(`${what} cannot be read`);
  }
  return object;
}

/**
 * An answer's body as text, reading at most `limit` bytes of it: past that (or when its
 * `Content-Length` says it will be) the body is cancelled, unread, and `cutOff` is true (the
 * text then empty). The server's answers are far smaller (a pulled page ~1.1 MiB at most); a
 * misbehaving proxy's huge or endless `200` would otherwise grow the tab for as long as
 * `requestTimeout` lets it come (at a network's pace, gigabytes).
 * @param {{headers: {get(name: string): string | null}, body: ReadableStream<Uint8Array> | null}} response
 * @param {number} limit
 * @returns {Promise<{text: string, cutOff: boolean}>}
 */
export async function readAnswer(response, limit) {
  const body = response.body;
  if (!body) return { text: '', cutOff: false };
  const announced = Number(response.headers.get('Content-Length') ?? -1);
  if (announced > limit) {
    await body.cancel().catch(() => {});
    return { text: '', cutOff: true };
  }
  const reader = body.getReader();
  /** @type {Uint8Array[]} */
  const chunks = [];
  let size = 0;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    size += value.byteLength;
    if (size > limit) {
      await reader.cancel().catch(() => {});
      return { text: '', cutOff: true };
    }
    chunks.push(value);
  }
  const bytes = new Uint8Array(size);
  let offset = 0;
  for (const chunk of chunks) {
    bytes.set(chunk, offset);
    offset += chunk.byteLength;
  }
  return { text: new TextDecoder().decode(bytes), cutOff: false };
}

// MARK: - IndexedDB

/** @param {IDBRequest | IDBTransaction} request */
function settled(request) {
  return new Promise((resolve, reject) => {
    if ('oncomplete' in request) {
      request.oncomplete = () => resolve(undefined);
      request.onabort = () => reject(request.error ?? new Error('transaction aborted'));
      request.onerror = () => reject(request.error);
    } else {
      request.onsuccess = () => resolve(request.result);
      request.onerror = () => reject(request.error);
    }
  });
}

/**
 * The values of `keys` in `store` (those there, in that order), read in one transaction;
 * should one of them be one the browser cannot read (`unreadableValue`: the transaction is
 * aborted), each in a transaction of its own (`readEach`), leaving out the unreadable ones.
 * @param {IDBDatabase} db @param {string} store @param {IDBValidKey[]} keys @returns {Promise<any[]>}
 */
async function readKeys(db, store, keys) {
  try {
    return await new Promise((resolve, reject) => {
      const tx = db.transaction(store);
      /** @type {unknown} */
      let failure = null;
      const requests = keys.map((key) => {
        const request = tx.objectStore(store).get(key);
        request.onerror = () => {
          failure ??= request.error;
        };
        return request;
      });
      tx.oncomplete = () => resolve(requests.map((request) => request.result).filter((value) => value !== undefined));
      tx.onabort = () => reject(failure ?? tx.error ?? new Error('transaction aborted'));
    });
  } catch (error) {
    if (!unreadableValue(error)) throw error;
    const { values } = await readEach(keys, (key) => settled(db.transaction(store).objectStore(store).get(key)));
    return values;
  }
}

/** The `meta` key of the outbox records a push found failing to read, and since when (ms). */
const UNREADABLE_NOTED = 'unreadable';

/**
 * The outbox's first `count` records (`head`) and what pushes noted of records failing to
 * read (`noted`: `meta` `unreadable`, undefined when none), in one transaction; rejects with
 * the outbox read's error.
 * @param {IDBDatabase} db @param {number} count
 * @returns {Promise<{head: any[], noted: unknown}>}
 */
function readHead(db, count) {
  return new Promise((resolve, reject) => {
    const tx = db.transaction(['outbox', 'meta']);
    const head = tx.objectStore('outbox').getAll(null, count);
    const noted = tx.objectStore('meta').get(UNREADABLE_NOTED);
    tx.oncomplete = () => resolve({ head: head.result, noted: noted.result });
    tx.onabort = () => reject(head.error ?? noted.error ?? tx.error ?? new Error('transaction aborted'));
  });
}

/**
 * Opens (and creates) one user's database; rejects with `storage_unavailable` when the
 * browser cannot give persistent storage (private modes, storage disabled, quota).
 * @param {string} name @returns {Promise<IDBDatabase>}
 */
function openDatabase(name) {
  return new Promise((resolve, reject) => {
    const fail = (/** @type {unknown} */ cause) =>
      reject(
        new TrunkSyncError(
          'storage_unavailable',
          `IndexedDB cannot be opened (${cause instanceof Error ? cause.message : String(cause)}): ` +
            'events cannot be kept safely, so nothing is recorded',
        ),
      );
    let request;
    try {
      if (typeof indexedDB === 'undefined') throw new Error('no indexedDB in this context');
      request = indexedDB.open(name, VERSION);
    } catch (error) {
      fail(error);
      return;
    }
    request.onupgradeneeded = () => {
      const db = request.result;
      if (!db.objectStoreNames.contains('outbox')) db.createObjectStore('outbox', { keyPath: 'n', autoIncrement: true });
      if (!db.objectStoreNames.contains('quarantine')) db.createObjectStore('quarantine', { keyPath: 'client_id' });
      if (!db.objectStoreNames.contains('meta')) db.createObjectStore('meta');
    };
    request.onsuccess = () => {
      const db = request.result;
      db.onversionchange = () => db.close();
      resolve(db);
    };
    request.onerror = () => fail(request.error);
    request.onblocked = () => fail(new Error('blocked by an older version open in another tab'));
  });
}

/**
 * Runs `work` in one transaction and resolves after it committed (strict durability: on
 * disk, not just in the OS's cache).
 * @template T
 * @param {IDBDatabase} db @param {string[]} stores @param {IDBTransactionMode} mode
 * @param {(tx: IDBTransaction) => T} work @returns {Promise<T>}
 */
async function transact(db, stores, mode, work) {
  let tx;
  try {
    tx = db.transaction(stores, mode, { durability: 'strict' });
  } catch (error) {
    throw new TrunkSyncError('storage_unavailable', `IndexedDB refused a transaction: ${String(error)}`);
  }
  const done = settled(tx);
  let result;
  try {
    result = work(tx);
  } catch (error) {
    // The work's own error (the transaction ends with it, uncommitted).
    done.catch(() => {});
    try {
      tx.abort();
    } catch {}
    throw error;
  }
  try {
    await done;
  } catch (error) {
    // Not committed: the disk or the origin's quota full (QuotaExceededError), the database
    // closed or deleted under it. Nothing of the transaction was kept.
    const name = error && typeof error === 'object' && 'name' in error ? `${error.name}: ` : '';
    throw new TrunkSyncError(
      'storage_unavailable',
      `IndexedDB did not commit the transaction (${name}${error instanceof Error ? error.message : String(error)})`,
    );
  }
  return result;
}

// MARK: - Local clean-up that must not be lost

/**
 * A sign-out or an account deletion decides what of a user's local data goes before it
 * touches IndexedDB, and writes that here (localStorage, synchronous) first: `'forget'` (the
 * cursor), `'discard'` (the cursor and the unsent and quarantined events), `'delete'` (the
 * whole database). When IndexedDB cannot do it then (it will not open, the tab closes), the
 * next opening of that user's database does it first; a `'delete'` is also tried again when
 * a client starts. The entry goes once it is done.
 * @param {string} url @param {string} userId
 */
const cleanupKey = (url, userId) => `trunk-sync|cleanup|${url}|${userId}`;

/** @param {string} key @returns {string | null} */
function pendingCleanup(key) {
  try {
    return localStorage.getItem(key);
  } catch {
    return null;
  }
}

/** @param {string} key @param {string | null} what */
function setCleanup(key, what) {
  try {
    if (what) localStorage.setItem(key, what);
    else localStorage.removeItem(key);
  } catch {
    // storage refused: done now or not at all
  }
}

/** Deletes a database; rejects when the browser refuses. @param {string} name */
function deleteDatabase(name) {
  return new Promise((resolve, reject) => {
    let request;
    try {
      request = typeof indexedDB === 'undefined' ? null : indexedDB.deleteDatabase(name);
    } catch (error) {
      reject(error);
      return;
    }
    if (!request) return reject(new Error('no indexedDB'));
    // Blocked: another tab's connection, which closes on the versionchange this sends; the
    // deletion goes on once it did.
    request.onsuccess = () => resolve(undefined);
    request.onerror = () => reject(request.error ?? new Error('deleteDatabase failed'));
  });
}

/**
 * Opens a user's database after doing any clean-up pending for them (see `cleanupKey`).
 * @param {string} url @param {string} userId @returns {Promise<IDBDatabase>}
 */
async function openUserDatabase(url, userId) {
  const name = `trunk-sync|${url}|${userId}`;
  const key = cleanupKey(url, userId);
  const pending = pendingCleanup(key);
  if (pending === 'delete') {
    try {
      await deleteDatabase(name);
    } catch (error) {
      throw new TrunkSyncError('storage_unavailable', `IndexedDB cannot delete ${name}: ${String(error)}`);
    }
    setCleanup(key, null);
  }
  const db = await openDatabase(name);
  if (pending === 'forget' || pending === 'discard') {
    try {
      await clearUserData(db, pending === 'discard');
    } catch (error) {
      db.close();
      throw error;
    }
    setCleanup(key, null);
  }
  return db;
}

/**
 * Forgets the cursor (and the live position); with `discard`, the unsent and quarantined
 * events too. One transaction.
 * @param {IDBDatabase} db @param {boolean} discard
 */
function clearUserData(db, discard) {
  const stores = discard ? ['meta', 'outbox', 'quarantine'] : ['meta'];
  return transact(db, stores, 'readwrite', (tx) => {
    for (const store of stores) tx.objectStore(store).clear();
  });
}

// MARK: - Helpers

const sleep = (/** @type {number} */ ms, /** @type {AbortSignal | undefined} */ signal) =>
  new Promise((resolve) => {
    const timer = setTimeout(finish, ms);
    function finish() {
      clearTimeout(timer);
      signal?.removeEventListener('abort', finish);
      if (typeof window !== 'undefined') window.removeEventListener('online', finish);
      resolve(undefined);
    }
    signal?.addEventListener('abort', finish);
    // Coming back online ends a wait for the network at once.
    if (typeof window !== 'undefined') window.addEventListener('online', finish);
  });

/**
 * An abort signal for one exchange: aborts with `parent` (the account's sign-out), or when
 * `ms` pass without `reset()` (`expired` then says so). `clear()` when the exchange is over.
 */
class Deadline {
  /** @param {AbortSignal | undefined} parent @param {number} ms */
  constructor(parent, ms) {
    this.parent = parent;
    this.ms = ms;
    this.expired = false;
    this.controller = new AbortController();
    this.signal = this.controller.signal;
    /** @type {ReturnType<typeof setTimeout> | undefined} */
    this.timer = undefined;
    this.follow = () => this.controller.abort();
    if (parent?.aborted) this.follow();
    else parent?.addEventListener('abort', this.follow);
    this.reset();
  }

  reset() {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => {
      this.expired = true;
      this.controller.abort();
    }, this.ms);
  }

  clear() {
    clearTimeout(this.timer);
    this.parent?.removeEventListener('abort', this.follow);
  }
}

/** @param {unknown} value */
function isPlainObject(value) {
  return value !== null && typeof value === 'object' && Object.getPrototypeOf(value) === Object.prototype;
}

const RETRYABLE = new Set([408, 429, 500, 502, 503, 504]);

/**
 * Whether `session` is the one `pin` names: its user, and when `pin.id` is set that very
 * session (`id` is made at sign-in and kept by its refreshes). A session without an `id`
 * was stored by an earlier version of this module (at sign-in, or by a tab still running
 * it, whose refresh drops the id): it is told apart by its user only, as that version did,
 * so such a tab's refresh does not make this session look like someone else's.
 * @param {any} session @param {{user_id: string, id?: string}} pin
 */
function matchesPin(session, pin) {
  return (
    Boolean(session) &&
    session.user_id === pin.user_id &&
    (pin.id === undefined || session.id === undefined || session.id === pin.id)
  );
}

const userChanged = () =>
  new TrunkSyncError(
    'user_changed',
    'another user was signed in meanwhile (another tab): nothing was sent with their session for this call',
  );

// MARK: - The client

/** One signed-in user's local state: database, channel, leadership. */
class Account {
  /** @param {TrunkSyncClient} client @param {string} userId */
  constructor(client, userId) {
    this.client = client;
    this.userId = userId;
    this.key = `${client.url}|${userId}`;
    this.stopped = new AbortController();
    /** @type {Promise<IDBDatabase> | null} */
    this.dbPromise = null;
    this.isLeader = false;
    this.channel = typeof BroadcastChannel === 'undefined' ? null : new BroadcastChannel(`trunk-sync|${this.key}`);
    if (this.channel) this.channel.onmessage = (message) => client._message(this, message.data);
    /** The `liveEvents()` iterators opened for this user. @type {Set<(event: any) => void>} */
    this.liveListeners = new Set();
    /** Wakes the leader's stream waiting for a first pull (see `streamStart`). @type {() => void} */
    this.pulled = () => {};
  }

  db() {
    if (!this.dbPromise) {
      this.dbPromise = openUserDatabase(this.client.url, this.userId);
      this.dbPromise.catch(() => {
        this.dbPromise = null; // the next call tries again
      });
    }
    return this.dbPromise;
  }

  /** @param {any} message */
  post(message) {
    try {
      this.channel?.postMessage(message);
    } catch {
      // closed
    }
  }

  stop() {
    this.stopped.abort();
    this.channel?.close();
    this.dbPromise?.then((db) => db.close()).catch(() => {});
  }
}

/**
 * `options[name]`, a time in milliseconds from 1 s to what a timer takes (2^31 − 1 ms), or
 * `fallback` when unset; anything else is refused (a 0 would make a timer spin).
 * @param {Record<string, unknown>} options @param {string} name @param {number} fallback
 */
export function milliseconds(options, name, fallback) {
  const value = options[name];
  if (value === undefined) return fallback;
  if (typeof value !== 'number' || !Number.isFinite(value) || value < 1000 || value > 2147483647) {
    throw new TypeError(`${name} must be a number of milliseconds from 1000 to 2147483647`);
  }
  return value;
}

/**
 * `options[name]`, a whole number of events from 1 to `max` (outside, the nearest), or
 * `fallback` when unset; anything else is refused (`pageSize: 0` asked the server for pages
 * of none, and every pull was refused).
 * @param {Record<string, unknown>} options @param {string} name @param {number} fallback @param {number} max
 */
export function eventCount(options, name, fallback, max) {
  const value = options[name];
  if (value === undefined) return fallback;
  if (typeof value !== 'number' || !Number.isInteger(value)) {
    throw new TypeError(`${name} must be a whole number of events from 1 to ${max}`);
  }
  return Math.max(1, Math.min(value, max));
}

/**
 * The browser client. See trunk-sync.d.ts for the documented options and methods.
 */
export class TrunkSyncClient {
  /** @param {import('./trunk-sync').TrunkSyncOptions} options */
  constructor(options) {
    if (!options || typeof options.url !== 'string') throw new TypeError('TrunkSyncClient needs { url }');
    const parsed = new URL(options.url);
    if (parsed.protocol !== 'https:' && parsed.protocol !== 'http:') throw new TypeError('url must be http(s)');
    /** The server's base URL, without a trailing slash. */
    this.url = parsed.origin + parsed.pathname.replace(/\/+$/, '');
    // At least one: a batch of none pushes nothing, for good, and says nothing.
    this.maxBatchEvents = eventCount(options, 'maxBatchEvents', 500, SERVER_MAX_BATCH_EVENTS);
    this.maxBatchBytes = Math.min(options.maxBatchBytes ?? 4 * 1024 * 1024, SERVER_MAX_BATCH_BYTES / 2);
    this.pageSize = eventCount(options, 'pageSize', 1000, SERVER_MAX_PAGE);
    this.retry = { maxAttempts: 6, baseDelay: 500, maxDelay: 30000, maxRetryAfter: 120000, ...options.retry };
    this.refreshMargin = options.refreshMargin ?? 60;
    this.requestTimeout = milliseconds(options, 'requestTimeout', 30000);
    /** The most bytes of an answer's body read (not the export's nor the stream's). */
    this.maxAnswerBytes = options.maxAnswerBytes ?? 32 * 1024 * 1024;
    if (!Number.isSafeInteger(this.maxAnswerBytes) || this.maxAnswerBytes < 1) {
      throw new TypeError('maxAnswerBytes must be a positive whole number of bytes');
    }
    this.streamIdleTimeout = milliseconds(options, 'streamIdleTimeout', 35000);
    this.pendingCheckInterval = milliseconds(options, 'pendingCheckInterval', 60000);
    this.live = options.live ?? true;
    this.autoPush = options.autoPush ?? true;
    /**
     * How long an outbox record's reads must have failed, across pushes, for a push to set it
     * aside when the browser does not say its value is gone (see `lostRecords`).
     */
    this.unreadableGrace = 10 * 60 * 1000;
    this.fetch = options.fetch ?? globalThis.fetch.bind(globalThis);
    this.sessionKey = `trunk-sync|session|${this.url}`;
    if (typeof navigator === 'undefined' || !navigator.locks) {
      throw new TrunkSyncError('unsupported', 'this browser has no Web Locks (navigator.locks); use a current browser over https or localhost');
    }
    /** @type {Set<(state: string) => void>} */
    this.stateListeners = new Set();
    /** @type {Promise<any> | null} */
    this.refreshing = null;
    /** @type {Account | null} */
    this.account = null;
    this.persistRequested = false;
    /**
     * Whether the browser keeps this origin's storage under pressure
     * (`navigator.storage.persist()`): null until it answered, or where it is not offered.
     * @type {boolean | null}
     */
    this.storagePersisted = null;
    this.closed = false;
    this.session = this.readSession();
    this.finishDeletions();
    this.openAccount();
    if (typeof window !== 'undefined') {
      window.addEventListener('storage', (event) => {
        if (event.key === this.sessionKey && !this.closed) {
          this.session = this.readSession();
          this.openAccount();
        }
      });
      window.addEventListener('online', () => this.schedulePush(0));
    }
  }

  // MARK: Session

  /** True while a session is stored for this server (also after a reload). */
  get isSignedIn() {
    return this.session !== null;
  }

  /** The signed-in user's id and email, or null. */
  get user() {
    return this.session ? { id: this.session.user_id, email: this.session.email } : null;
  }

  /** True while this tab is its account's leader (pushes, pulls, holds the live stream). */
  get isLeader() {
    return this.account?.isLeader ?? false;
  }

  readSession() {
    try {
      const text = localStorage.getItem(this.sessionKey);
      const session = text ? JSON.parse(text) : null;
      return session && typeof session.refresh_token === 'string' && typeof session.user_id === 'string'
        ? session
        : null;
    } catch {
      return null;
    }
  }

  /** @param {any} session */
  storeSession(session) {
    try {
      if (session) localStorage.setItem(this.sessionKey, JSON.stringify(session));
      else localStorage.removeItem(this.sessionKey);
    } catch (error) {
      throw new TrunkSyncError('storage_unavailable', `the session cannot be stored: ${String(error)}`);
    }
    this.session = session;
    this.openAccount();
  }

  /** Opens the local state of the stored session's user (closing another user's). */
  openAccount() {
    const userId = this.session?.user_id ?? null;
    if (this.account && this.account.userId === userId) return;
    const wasSignedIn = this.account !== null;
    this.account?.stop();
    this.account = null;
    if (!userId) {
      // However it ended: signOut, deleteAccount, a refresh the server refused, another tab.
      if (wasSignedIn) this.emitState('signed_out');
      return;
    }
    const account = new Account(this, userId);
    this.account = account;
    this.requestPersistence();
    const { signal } = account.stopped;
    navigator.locks
      .request(`trunk-sync|leader|${account.key}`, { signal }, async () => {
        account.isLeader = true;
        this.emitState('leader');
        try {
          await this.lead(account);
        } finally {
          account.isLeader = false;
        }
      })
      .catch(() => {}); // aborted on sign-out or switch
  }

  /**
   * Asks once for persistent storage. A refusal (the browser may then evict the outbox
   * under storage pressure) sets `storagePersisted` to false and emits
   * `'storage_not_persisted'`, for the app to tell the user.
   */
  requestPersistence() {
    if (this.persistRequested) return;
    this.persistRequested = true;
    let answer;
    try {
      answer = navigator.storage?.persist?.();
    } catch {
      // not offered here
    }
    if (!answer) return;
    Promise.resolve(answer)
      .then(
        (granted) => granted === true,
        () => false,
      )
      .then((granted) => {
        this.storagePersisted = granted;
        if (!granted) this.emitState('storage_not_persisted');
      });
  }

  /**
   * Deletes the databases of users whose account deletion this browser could not finish
   * locally (see `cleanupKey`): not the signed-in user's, whose `db()` does it.
   */
  finishDeletions() {
    /** @type {string[]} */
    let keys = [];
    try {
      const prefix = `trunk-sync|cleanup|${this.url}|`;
      for (let index = 0; index < localStorage.length; index++) {
        const key = localStorage.key(index);
        if (key?.startsWith(prefix) && localStorage.getItem(key) === 'delete') keys.push(key);
      }
    } catch {
      return;
    }
    for (const key of keys) {
      const userId = key.slice(key.lastIndexOf('|') + 1);
      if (userId === this.session?.user_id) continue;
      deleteDatabase(`trunk-sync|${this.url}|${userId}`).then(
        () => {
          if (pendingCleanup(key) === 'delete') setCleanup(key, null);
        },
        () => {}, // tried again at the next start
      );
    }
  }

  /** @param {string} state @param {unknown} [detail] */
  emitState(state, detail) {
    for (const listener of this.stateListeners) {
      try {
        listener(state, detail);
      } catch (error) {
        queueMicrotask(() => {
          throw error; // the app's bug, reported as uncaught, not the client's
        });
      }
    }
  }

  /**
   * Tells `listener` what happens in the background: `'leader'` (this tab became its
   * account's leader), `'signed_out'` (the session ended, however), `'push_failed'` (the
   * leader's push failed and will be tried again; detail: the error), `'rejected'` (the
   * leader's push moved events the server refused, or outbox records it could not send or
   * the browser could not read, to the quarantine; detail: them; so does any push, `sync()`'s
   * too, that failed after it moved some), `'live_failed'` (the
   * leader's live stream failed — no answer, a page in the way, a message it cannot read,
   * silence — and is reopened after a backoff; detail: the error), `'pushed'` (in every
   * tab: a push, any tab's, took events out of the outbox, the server having stored them;
   * `pendingCount()` is smaller), `'storage_not_persisted'` (the browser refused persistent storage: it may clear this
   * origin's data, unsent events included, under storage pressure; see `storagePersisted`).
   * @param {(state: string, detail?: unknown) => void} listener
   */
  onStateChange(listener) {
    this.stateListeners.add(listener);
    return () => this.stateListeners.delete(listener);
  }

  /** Mails a 6-digit sign-in code. Not repeated after a network failure. @param {string} email */
  async sendCode(email) {
    await this.request('POST', '/auth/v1/otp', { body: { email }, auth: false, retry: false });
  }

  /** Signs in with the mailed code; the session is stored for this server. */
  async verify(/** @type {string} */ email, /** @type {string} */ code) {
    const body = await this.request('POST', '/auth/v1/verify', {
      body: { email, token: code, type: 'email' },
      auth: false,
      retry: false,
    });
    this.storeSession(this.sessionFrom(body, crypto.randomUUID()));
  }

  /** @param {any} body @param {string | undefined} id this session's id here (see matchesPin) */
  sessionFrom(body, id) {
    if (!body || typeof body.access_token !== 'string' || !body.user || typeof body.user.id !== 'string') {
      throw new TrunkSyncError('invalid_response', 'the server answered without a session');
    }
    const now = Math.floor(Date.now() / 1000);
    return {
      access_token: body.access_token,
      refresh_token: body.refresh_token,
      expires_in: body.expires_in,
      // The local clock decides when to refresh, whatever the server's says.
      expires_at: now + Number(body.expires_in || 3600),
      user_id: body.user.id,
      email: body.user.email ?? null,
      id,
    };
  }

  /**
   * The access token, refreshed first when it expires soon; with `pin`, only that user's
   * (else `user_changed`).
   * @param {{user_id: string, id?: string}} [pin]
   */
  async accessToken(pin) {
    const session = this.session;
    if (!session) throw new TrunkSyncError('not_signed_in', 'sign in first');
    if (pin && !matchesPin(session, pin)) throw userChanged();
    const margin = Math.min(this.refreshMargin, (session.expires_in || 3600) / 2);
    if (session.expires_at - Date.now() / 1000 > margin) return session.access_token;
    const fresh = await this.refresh(session.access_token, pin);
    if (pin && !matchesPin(fresh, pin)) throw userChanged(); // a refresh another call started
    return fresh.access_token;
  }

  /**
   * One refresh for every tab of this origin: under a Web Lock, and only when the stored
   * session still has the token that failed (another tab may have refreshed meanwhile).
   * With `pin`, never another user's session (`user_changed`); a session another tab stored
   * while the refresh was under way is kept, not overwritten.
   * @param {string} staleToken @param {{user_id: string, id?: string}} [pin]
   */
  refresh(staleToken, pin) {
    if (this.refreshing) return this.refreshing;
    this.refreshing = navigator.locks
      .request(`trunk-sync|refresh|${this.url}`, async () => {
        const stored = this.readSession();
        if (!stored || stored.user_id !== this.session?.user_id) {
          // Signed out, or another user signed in, by another tab whose storage event has not
          // come yet: not a session of this call's to end or refresh.
          this.session = stored;
          this.openAccount();
          if (!stored) throw new TrunkSyncError('session_expired', 'signed out meanwhile');
          throw userChanged();
        }
        if (pin && !matchesPin(stored, pin)) throw userChanged();
        const margin = Math.min(this.refreshMargin, (stored.expires_in || 3600) / 2);
        if (stored.access_token !== staleToken && stored.expires_at - Date.now() / 1000 > margin) {
          this.session = stored;
          return stored;
        }
        let session = null;
        let refusal = null;
        for (let answers = 1; !session && !refusal; answers++) {
          try {
            const body = await this.request('POST', '/auth/v1/token?grant_type=refresh_token', {
              body: { refresh_token: stored.refresh_token },
              auth: false,
            });
            session = this.sessionFrom(body, stored.id);
          } catch (error) {
            if (!(error instanceof TrunkSyncError)) throw error;
            // A 2xx that is not a session (mangled on the way: a proxy, a body cut short) may
            // come after the server rotated the token. Asked again now, within the server's
            // reuse interval (10 s), the same token gets another of the same session; kept for
            // a later refresh, it would be a reuse that revokes the session. Up to 3 answers.
            if (error.code === 'invalid_response' && !error.fromServer) {
              if (answers < 3) continue;
              throw error;
            }
            // Only the server's own refusal ends the session: a page of something in the way (a
            // proxy's 4xx while it is set up wrong, a captive portal) is a failure, the session
            // stays and the next refresh goes through.
            if (![400, 401, 403].includes(error.status) || !error.fromServer) throw error;
            refusal = error;
          }
        }
        // Another tab may have signed out, or in (as anyone), while the answer came: the
        // answer, a refusal too (the session it refreshed was revoked by that sign-out), is
        // about a session no longer stored, and neither replaces nor ends the one there now.
        const now = this.readSession();
        if (!now || now.user_id !== stored.user_id || now.id !== stored.id) {
          this.session = now;
          this.openAccount();
          if (!now) throw new TrunkSyncError('session_expired', 'signed out meanwhile');
          if (now.user_id !== stored.user_id || pin?.id !== undefined) throw userChanged();
          return now; // the same user signed in again: their newer session
        }
        if (refusal) {
          // Revoked or expired: signed out here; the outbox stays for the next sign-in.
          this.storeSession(null);
          throw new TrunkSyncError('session_expired', 'the session ended: sign in again', { status: refusal.status });
        }
        this.storeSession(session);
        return session;
      })
      .finally(() => {
        this.refreshing = null;
      });
    return this.refreshing;
  }

  // MARK: HTTP

  /**
   * One API call with retries: network failures (no answer within `requestTimeout` is one),
   * 408, 429, 500, 502, 503, 504; Retry-After honoured exactly (plus ≤ 10 % jitter), else
   * full-jitter backoff; one refresh after a 401. `raw`: `{response, deadline}` once the
   * head came, the deadline still running for the body (the caller resets and clears it).
   * An authenticated call is for the user signed in when it starts (`pin`, else that
   * one): once another tab signed in someone else it throws `user_changed` rather than
   * send, refresh or sign out with their session. `token`: sent as it is (no refresh, no
   * sign-out on a 401).
   * `bodyText`: the body already as JSON text (instead of `body`).
   * @param {string} method @param {string} path
   * @param {{body?: any, bodyText?: string, auth?: boolean, retry?: boolean, raw?: boolean,
   *   signal?: AbortSignal, pin?: {user_id: string, id?: string}, token?: string}} [options]
   */
  async request(method, path, options = {}) {
    const { body, auth = true, retry = true, raw = false, signal, token: fixedToken } = options;
    const text = options.bodyText ?? (body === undefined ? undefined : JSON.stringify(body));
    const pin = options.pin ?? (auth && !fixedToken && this.session ? { user_id: this.session.user_id } : undefined);
    let refreshed = false;
    for (let attempt = 0; ; attempt++) {
      if (signal?.aborted) throw new TrunkSyncError('cancelled', 'cancelled');
      /** @type {Record<string, string>} */
      const headers = { Accept: 'application/json' };
      let token = null;
      if (auth) {
        token = fixedToken ?? (await this.accessToken(pin));
        headers.Authorization = `Bearer ${token}`;
      }
      if (text !== undefined) headers['Content-Type'] = 'application/json';
      // A lost answer must not hold the sync lock (every tab's) until the OS gives up.
      const deadline = new Deadline(signal, this.requestTimeout);
      let response;
      let answer = '';
      let cutOff = false;
      let handedOut = false;
      try {
        response = await this.fetch(this.url + path, {
          method,
          headers,
          body: text,
          cache: 'no-store',
          signal: deadline.signal,
        });
        handedOut = raw && response.ok;
        if (!handedOut) ({ text: answer, cutOff } = await readAnswer(response, this.maxAnswerBytes));
      } catch (error) {
        if (signal?.aborted) throw new TrunkSyncError('cancelled', 'cancelled');
        if (!retry || attempt + 1 >= this.retry.maxAttempts) {
          throw new TrunkSyncError(
            'network',
            deadline.expired
              ? `no answer within ${this.requestTimeout} ms`
              : `the server cannot be reached: ${String(error)}`,
          );
        }
        await sleep(backoffDelay(attempt, this.retry), signal);
        continue;
      } finally {
        if (!handedOut) deadline.clear();
      }
      if (response.ok) {
        if (raw) return { response, deadline };
        if (cutOff) {
          throw new TrunkSyncError(
            'invalid_response',
            `the server answered ${response.status} with a body of over ${this.maxAnswerBytes} bytes ` +
              "(maxAnswerBytes), not read: not the server's",
            { status: response.status },
          );
        }
        if (!answer) return null;
        try {
          return JSON.parse(answer);
        } catch {
          throw new TrunkSyncError('invalid_response', `the server answered ${response.status} with a body that is not JSON`);
        }
      }
      let errorBody = null;
      try {
        errorBody = JSON.parse(answer);
      } catch {
        // not JSON
      }
      // Only the server's own 401 (its JSON error: the token expired or was refused) is worth
      // a refresh. A 401 page of something in the way (a proxy asking for its own
      // credentials) says nothing of the token: it is a failure (`http_401`, below), and the
      // leader's push backs off from it as from any page in the way, spending no refresh.
      if (response.status === 401 && auth && !fixedToken && !refreshed && isServerError(errorBody)) {
        refreshed = true;
        await this.refresh(token, pin);
        attempt--;
        continue;
      }
      const retryAfter = parseRetryAfter(response.headers.get('Retry-After'), response.headers.get('Date'));
      const fromServer = isServerError(errorBody);
      const code = typeof errorBody?.error_code === 'string' ? errorBody.error_code : errorBody?.code;
      const error = new TrunkSyncError(
        fromServer ? code : `http_${response.status}`,
        errorBody?.message ?? errorBody?.msg ?? `HTTP ${response.status}`,
        { status: response.status, details: errorBody?.details, retryAfter: retryAfter ?? undefined, fromServer },
      );
      // A 401 again with a fresh token: the server ended the session. A 401 page of something
      // in between (a proxy asking for its own credentials) is a failure: the session stays.
      if (response.status === 401 && auth && !fixedToken && fromServer) {
        const stored = this.readSession();
        if (stored && pin && !matchesPin(stored, pin)) throw userChanged(); // not theirs to end
        this.storeSession(null);
        throw new TrunkSyncError('session_expired', 'the session ended: sign in again', { status: 401 });
      }
      if (!retry || !RETRYABLE.has(response.status)) throw error;
      if (retryAfter !== null && retryAfter > this.retry.maxRetryAfter) {
        throw new TrunkSyncError('rate_limited', `the server asks to wait ${retryAfter / 1000} s`, {
          status: response.status,
          retryAfter,
        });
      }
      if (attempt + 1 >= this.retry.maxAttempts) throw error;
      const wait =
        retryAfter !== null && (response.status === 429 || response.status === 503)
          ? retryAfterDelay(retryAfter)
          : backoffDelay(attempt, this.retry);
      await sleep(wait, signal);
    }
  }

  /**
   * How long the leader's background work (push, stream) waits for a Retry-After of `ms`: as
   * asked, but at most `maxRetryAfter` before it tries again (and is told again), so a date
   * counted from a clock that is off (see parseRetryAfter) or a proxy's odd answer never
   * stops it for hours.
   * @param {number} ms
   */
  retryAfterWait(ms) {
    return retryAfterDelay(Math.min(ms, this.retry.maxRetryAfter));
  }

  /** The signed-in user's account; throws when signed out. */
  current() {
    if (!this.account) throw new TrunkSyncError('not_signed_in', 'sign in first');
    return this.account;
  }

  // MARK: Outbox

  /**
   * Records an event: resolves with its client_id once it is committed to IndexedDB with
   * strict durability. The id is sent with every push of the event, so the server stores
   * it once whatever happens.
   * @param {string} type @param {Record<string, unknown>} payload @returns {Promise<string>}
   */
  async record(type, payload) {
    // Characters as the server counts them: Unicode scalars (code points), not UTF-16 units.
    const length = typeof type === 'string' ? [...type].length : 0;
    if (length < 1 || length > 128) throw new TrunkSyncError('invalid_event', 'type must be 1–128 characters');
    if (!isPlainObject(payload)) throw new TrunkSyncError('invalid_event', 'payload must be a plain object');
    const json = JSON.stringify(payload);
    const bytes = utf8Length(json);
    if (bytes > MAX_PAYLOAD_BYTES) throw new TrunkSyncError('invalid_event', 'payload is over 64 KiB');
    const account = this.current();
    const db = await account.db();
    const event = {
      client_id: crypto.randomUUID(),
      type,
      payload: JSON.parse(json),
      client_timestamp: new Date().toISOString(),
      bytes,
    };
    await transact(db, ['outbox'], 'readwrite', (tx) => tx.objectStore('outbox').add(event));
    account.post({ kind: 'recorded' });
    this.schedulePush();
    return event.client_id;
  }

  /** Events recorded and not yet stored by the server (quarantined ones excluded). */
  async pendingCount() {
    const db = await this.current().db();
    const request = db.transaction('outbox').objectStore('outbox').count();
    return settled(request);
  }

  /**
   * Events the server refused (400 naming them), oldest first, with the reason; an entry the
   * browser cannot read (see `unreadableValue`) is listed as what is left of it
   * (`unreadableEntry`: its key, the error), first, instead of failing the call for good.
   */
  async quarantinedEvents() {
    const db = await this.current().db();
    const store = () => db.transaction('quarantine').objectStore('quarantine');
    /** @type {any[]} */
    let all;
    try {
      all = await settled(store().getAll());
    } catch (error) {
      if (!unreadableValue(error)) throw error;
      const keys = await settled(store().getAllKeys());
      const { values, unreadable } = await readEach(keys, (key) => settled(store().get(key)));
      all = [...values, ...unreadable.map(({ key, error: cause }) => unreadableEntry('quarantine', key, cause, ''))];
    }
    // An entry without a readable quarantined_at (written by something else) sorts first
    // rather than failing the call, for good.
    const when = (/** @type {any} */ entry) => String(entry?.quarantined_at ?? '');
    return all.sort((a, b) => when(a).localeCompare(when(b))).map(({ bytes, n, ...rest }) => rest);
  }

  /** Drops quarantined events for good. @param {string[]} clientIds */
  async discardQuarantined(clientIds) {
    const db = await this.current().db();
    await transact(db, ['quarantine'], 'readwrite', (tx) => {
      for (const id of clientIds) tx.objectStore('quarantine').delete(id);
    });
  }

  /**
   * Puts quarantined events back in the outbox, same ids. What holds no event stays where it
   * is: an entry for a record the browser could not read (field `unreadable`), and one it
   * cannot read now (both for `discardQuarantined`).
   * @param {string[]} clientIds
   */
  async requeueQuarantined(clientIds) {
    const db = await this.current().db();
    // Read before, not in the transaction that moves them: Chrome aborts the transaction in
    // which a value could not be read, which would take the others' requeue with it.
    const records = await readKeys(db, 'quarantine', [...new Set(clientIds)]);
    await transact(db, ['quarantine', 'outbox'], 'readwrite', (tx) => {
      const quarantine = tx.objectStore('quarantine');
      for (const record of records) {
        if (!record || record.field === 'unreadable') continue;
        // Still there (its key only: another tab may have requeued or dropped it meanwhile).
        const there = quarantine.getKey(record.client_id);
        there.onsuccess = () => {
          if (there.result === undefined) return;
          quarantine.delete(record.client_id);
          const { quarantined_at, field, reason, n, ...event } = record;
          tx.objectStore('outbox').add(event);
        };
      }
    });
    this.schedulePush(0);
  }

  // MARK: Sync

  /**
   * Pushes the outbox, then, given a `handler`, pulls every page after the stored cursor,
   * calling it with each (the cursor is stored only after it returned); without one it only
   * pushes. One tab at a time (a Web Lock).
   * @param {(events: any[]) => unknown | Promise<unknown>} [handler]
   */
  async sync(handler) {
    const account = this.current();
    return navigator.locks.request(`trunk-sync|sync|${account.key}`, async () => {
      const pushed = await this.pushAll(account);
      const pulled = handler ? await this.pullAll(account, handler) : 0;
      return { ...pushed, pulled };
    });
  }

  /**
   * Pushes every event in the outbox, oldest first, in batches within the limits. A push
   * that fails after it moved events to the quarantine (refused by the server, set aside)
   * tells them all the same, in `'rejected'`: its report goes with the error, and they are
   * told only once.
   * @param {Account} account @param {{retry?: boolean}} [options]
   */
  async pushAll(account, options = {}) {
    const report = { pushed: 0, duplicates: 0, rejected: /** @type {any[]} */ ([]) };
    try {
      return await this.pushBatches(account, options, report);
    } catch (error) {
      if (report.rejected.length > 0) this.emitState('rejected', report.rejected);
      throw error;
    }
  }

  /**
   * `pushAll`'s batches, counted in `report`.
   * @param {Account} account @param {{retry?: boolean}} options
   * @param {{pushed: number, duplicates: number, rejected: any[]}} report
   */
  async pushBatches(account, options, report) {
    const db = await account.db();
    // Halved to find the event a 400 is about (the full size again after), or to fit under a
    // 413's body limit (someone's on the way, say a proxy's): kept for the rest of this push,
    // so each batch after does not send megabytes only to be refused again.
    let maxEvents = this.maxBatchEvents;
    let fits = this.maxBatchEvents;
    /** Outbox keys first noted as failing by this push (see lostRecords). */
    const noted = new Set();
    for (;;) {
      if (account.stopped.signal.aborted) throw new TrunkSyncError('cancelled', 'signed out');
      const fromOutbox = () => db.transaction('outbox').objectStore('outbox');
      /** @type {any[]} */
      let head;
      try {
        const read = await readHead(db, maxEvents);
        head = read.head;
        // Every record of the head read: those noted as failing (lostRecords) may fail again
        // only from now on.
        if (read.noted !== undefined) {
          await transact(db, ['meta'], 'readwrite', (tx) => tx.objectStore('meta').delete(UNREADABLE_NOTED));
        }
      } catch (error) {
        // A record the browser cannot read (its value's file lost or damaged: see
        // unreadableValue) failed this read as a whole, and would fail every push, the events
        // after it never sent. Found by reading the head's keys, then each record on its own,
        // it leaves the outbox for the quarantine (setAside) and the push goes on, once the
        // browser says its value is gone, or it failed long enough (lostRecords); a failure
        // that is no record's (none of them fails alone) fails the push as before.
        if (!unreadableValue(error)) throw error;
        const keys = await settled(fromOutbox().getAllKeys(null, maxEvents));
        const { unreadable: failing } = await readEach(keys, (key) => settled(fromOutbox().get(key)));
        if (failing.length === 0) throw error;
        const lost = await this.lostRecords(db, failing, noted);
        if (lost.length === 0) throw failing[0].error;
        report.rejected.push(...(await this.setAside(db, [], lost)));
        continue;
      }
      // A record that cannot be sent (see outboxProblem) would fail every push, the events
      // after it never sent: it goes to the quarantine as it is, and the push goes on.
      const unreadable = head.filter((record) => outboxProblem(record, false) !== null);
      if (unreadable.length > 0) {
        report.rejected.push(...(await this.setAside(db, unreadable)));
        continue;
      }
      const batch = firstBatch(head, { maxEvents, maxBytes: this.maxBatchBytes });
      if (batch.length === 0) return report;
      const events = batch.map(({ client_id, type, payload, client_timestamp }) => ({
        client_id,
        type,
        payload,
        client_timestamp,
      }));
      let text;
      try {
        text = JSON.stringify({ events });
      } catch (error) {
        const unsendable = batch.filter((record) => outboxProblem(record) !== null);
        if (unsendable.length === 0) throw error;
        report.rejected.push(...(await this.setAside(db, unsendable)));
        continue;
      }
      let answer;
      try {
        answer = await this.request('POST', '/sync/v1/events', {
          bodyText: text,
          signal: account.stopped.signal,
          retry: options.retry ?? true,
        });
      } catch (error) {
        if (!(error instanceof TrunkSyncError) || (error.status !== 400 && error.status !== 413)) throw error;
        // Not the server's judgement of the events but a page of something in the way (a proxy
        // set up wrong): nothing is quarantined for it (one event a push, they would stop
        // syncing); the push fails, the events stay in the outbox. A 413 page still halves the
        // batch, as a proxy's body limit asks.
        if (error.status === 400 && !error.fromServer) throw error;
        const refused = error.status === 400 ? refusedEvents({ details: error.details }, batch.length) : new Map();
        if (refused.size === 0 && batch.length > 1) {
          maxEvents = Math.max(1, Math.floor(batch.length / 2)); // find the one it is about
          if (error.status === 413) fits = maxEvents;
          continue;
        }
        if (refused.size === 0) refused.set(0, { field: '', reason: error.message });
        const moved = await this.quarantine(db, batch, refused);
        report.rejected.push(...moved);
        continue;
      }
      // Only what the answer names stored leaves the outbox; an answer that does not name
      // every event of the batch is not the server's (a proxy's, a broken one's): the rest
      // stays for the next push, and the push fails (the leader backs off).
      const results = pushResults(answer);
      const stored = results ? batch.filter((record) => results.has(record.client_id)) : [];
      if (stored.length > 0) {
        await transact(db, ['outbox'], 'readwrite', (tx) => {
          // The batch is the outbox's first records in key order, and keys only grow (every
          // record is added with a generated key): no other record has a key between two of
          // its records. So each run of stored records goes in one key-range delete — 1,000
          // single deletes a batch made the push four times slower (bench/web-client).
          const outbox = tx.objectStore('outbox');
          let start = -1;
          for (let i = 0; i <= batch.length; i++) {
            const named = i < batch.length && results?.has(batch[i].client_id);
            if (named && start < 0) start = i;
            if (!named && start >= 0) {
              outbox.delete(IDBKeyRange.bound(batch[start].n, batch[i - 1].n));
              start = -1;
            }
          }
        });
        // Fewer events wait now: every tab's `pendingCount()` says so from here on. (The live
        // event of what was pushed may come before this answer: no count read then shows it.)
        this.emitState('pushed');
        account.post({ kind: 'pushed' });
      }
      for (const record of stored) {
        if (results?.get(record.client_id) === 'created') report.pushed++;
        else report.duplicates++;
      }
      if (stored.length < batch.length) {
        throw new TrunkSyncError(
          'invalid_response',
          `the push answer names ${stored.length} of ${batch.length} events as stored; the others stay in the outbox`,
        );
      }
      maxEvents = fits;
    }
  }

  /**
   * Moves the refused events of a batch from the outbox to the quarantine, in one transaction.
   * @param {IDBDatabase} db @param {any[]} batch @param {Map<number, {field: string, reason: string}>} refused
   */
  async quarantine(db, batch, refused) {
    const moved = [];
    const now = new Date().toISOString();
    await transact(db, ['outbox', 'quarantine'], 'readwrite', (tx) => {
      for (const [index, problem] of refused) {
        const record = batch[index];
        if (!record) continue;
        tx.objectStore('outbox').delete(record.n);
        const { n, ...event } = record;
        tx.objectStore('quarantine').put({ ...event, ...problem, quarantined_at: now });
        moved.push({ client_id: event.client_id, type: event.type, ...problem });
      }
    });
    return moved;
  }

  /**
   * Of the outbox records whose reads failed (`failing`, from `readEach`), those to set
   * aside: at once one whose value the browser says is gone (`valueLost`); one whose read
   * failed otherwise (`UnknownError`, `DataError`: Chrome's internal, likely transient,
   * errors, a file locked or not readable for a while) only once it also failed in an
   * earlier push, `unreadableGrace` ms or more before (when first, noted in `meta`
   * `unreadable`; a push that reads the outbox's head clears it). Until then the push fails
   * with its error, as before, the record kept: a readable event is never dropped for a
   * read that failed for a moment. `noted`: the keys this push noted first.
   * @param {IDBDatabase} db @param {{key: IDBValidKey, error: unknown}[]} failing
   * @param {Set<string>} noted
   */
  async lostRecords(db, failing, noted) {
    const now = Date.now();
    /** @type {{key: IDBValidKey, error: unknown}[]} */
    const lost = [];
    await transact(db, ['meta'], 'readwrite', (tx) => {
      const meta = tx.objectStore('meta');
      const request = meta.get(UNREADABLE_NOTED);
      request.onsuccess = () => {
        const stored = request.result;
        /** @type {Record<string, number>} */
        const before = stored && typeof stored === 'object' ? stored : {};
        /** @type {Record<string, number>} */
        const since = {};
        for (const record of failing) {
          const key = String(record.key);
          const first = Number.isFinite(before[key]) ? before[key] : undefined;
          if (valueLost(record.error) || (first !== undefined && !noted.has(key) && now - first >= this.unreadableGrace)) {
            lost.push(record);
            continue;
          }
          if (first === undefined) noted.add(key);
          since[key] = first ?? now;
        }
        // Only the records failing now: one read meanwhile starts again.
        if (Object.keys(since).length > 0) meta.put(since, UNREADABLE_NOTED);
        else meta.delete(UNREADABLE_NOTED);
      };
    });
    return lost;
  }

  /**
   * Moves outbox records that cannot be sent (`outboxProblem`) to the quarantine as they are,
   * in one transaction: field `record`, the reason, under their `client_id` (`unreadable-<n>`
   * when it is not a string, and never over an entry already there). Never sent, never
   * dropped: `quarantinedEvents()` lists them, `discardQuarantined` drops them. The records
   * the browser cannot read (`unreadable`: their keys, with its error) have no bytes left to
   * move: each is replaced by what is left of it (`unreadableEntry`: field `unreadable`,
   * its outbox key and the error, under `unreadable-<n>`), told once, here, and then kept
   * until the app discards it.
   * @param {IDBDatabase} db @param {any[]} records
   * @param {{key: IDBValidKey, error: unknown}[]} [unreadable]
   */
  async setAside(db, records, unreadable = []) {
    /** @type {any[]} */
    const moved = [];
    const now = new Date().toISOString();
    await transact(db, ['outbox', 'quarantine'], 'readwrite', (tx) => {
      const outbox = tx.objectStore('outbox');
      const quarantine = tx.objectStore('quarantine');
      /** @param {IDBValidKey} n @param {any} entry */
      const keep = (n, entry) => {
        const there = quarantine.getKey(entry.client_id);
        there.onsuccess = () => {
          const client_id = there.result === undefined ? entry.client_id : `${entry.client_id}|unreadable-${n}`;
          quarantine.put({ ...entry, client_id });
          const { type, field, reason } = entry;
          moved.push({ client_id, type: typeof type === 'string' ? type : '', field, reason });
        };
      };
      for (const record of records) {
        const reason = `the outbox record cannot be sent: ${outboxProblem(record) ?? 'unreadable'}`;
        const own = typeof record.client_id === 'string' ? record.client_id : `unreadable-${record.n}`;
        const { n, ...kept } = record;
        outbox.delete(n);
        keep(n, { ...kept, client_id: own, field: 'record', reason, quarantined_at: now });
      }
      for (const { key, error } of unreadable) {
        // Its key only (a read of its value would abort this transaction): still there?
        const there = outbox.getKey(key);
        there.onsuccess = () => {
          if (there.result === undefined) return;
          outbox.delete(key);
          keep(key, unreadableEntry('outbox', key, error, now));
        };
      }
    });
    return moved;
  }

  /**
   * Pulls every page after the stored cursor into `handler`. Once it reached the end it
   * tells the leader (in this tab or another), whose stream may be waiting for that: on a
   * first sign-in it starts after this cursor (see `streamStart`).
   * @param {Account} account @param {(events: any[]) => unknown} handler
   */
  async pullAll(account, handler) {
    const db = await account.db();
    const stored = storedSeq(await settled(db.transaction('meta').objectStore('meta').get('cursor')));
    let cursor = stored ?? 0;
    // Stored also when it stays 0 (an empty account), so a new leader knows a pull ended.
    let unstored = stored === undefined;
    let pulled = 0;
    for (;;) {
      const page = checkedPage(
        await this.request('GET', `/sync/v1/events?after=${cursor}&limit=${this.pageSize}`, {
          signal: account.stopped.signal,
        }),
        cursor,
      );
      if (page.events.length > 0) {
        await handler(page.events);
        pulled += page.events.length;
      }
      if (page.next_after !== cursor || (unstored && !page.has_more)) {
        cursor = page.next_after;
        await transact(db, ['meta'], 'readwrite', (tx) => tx.objectStore('meta').put(cursor, 'cursor'));
        unstored = false;
      }
      if (!page.has_more) {
        account.pulled();
        account.post({ kind: 'pulled' });
        return pulled;
      }
    }
  }

  /** The leader pushes when the outbox holds events. @param {Account} account */
  async pushIfPending(account) {
    if (account !== this.account || !account.isLeader || account.pushTimer) return;
    try {
      const db = await account.db();
      if ((await settled(db.transaction('outbox').objectStore('outbox').count())) > 0) this.schedulePush(0);
    } catch {
      // the database closed (signed out): nothing to push from here
    }
  }

  /** The leader pushes shortly after any tab recorded. @param {number} [delay] */
  schedulePush(delay = 20) {
    const account = this.account;
    if (!account?.isLeader || !this.autoPush) return;
    account.pushWanted = true;
    if (account.pushTimer) return;
    account.pushTimer = setTimeout(() => this.backgroundPush(account), delay);
  }

  /**
   * The leader's pushes: one try per round under the sync lock, the waits (Retry-After or
   * backoff) outside it, so an explicit `sync()` in any tab never waits behind a backoff.
   * @param {Account} account
   */
  async backgroundPush(account) {
    let attempt = 0;
    while (account.pushWanted && !account.stopped.signal.aborted && account.isLeader) {
      account.pushWanted = false;
      try {
        const report = await navigator.locks.request(
          `trunk-sync|sync|${account.key}`,
          { signal: account.stopped.signal },
          () => this.pushAll(account, { retry: false }),
        );
        if (report.rejected.length > 0) this.emitState('rejected', report.rejected);
        attempt = 0;
      } catch (error) {
        if (account.stopped.signal.aborted) break;
        if (error instanceof TrunkSyncError && (error.code === 'session_expired' || error.code === 'not_signed_in')) break;
        this.emitState('push_failed', error);
        account.pushWanted = true;
        const retryAfter = error instanceof TrunkSyncError ? error.retryAfter : undefined;
        const wait = retryAfter !== undefined ? this.retryAfterWait(retryAfter) : backoffDelay(attempt++, this.retry);
        await sleep(wait, account.stopped.signal);
      }
    }
    account.pushTimer = null;
  }

  // MARK: Leadership and live events

  /** @param {Account} account @param {any} message */
  _message(account, message) {
    if (account !== this.account || !message) return;
    if (message.kind === 'recorded') this.schedulePush();
    else if (message.kind === 'pulled') account.pulled();
    else if (message.kind === 'pushed') this.emitState('pushed');
    else if (message.kind === 'live' && Array.isArray(message.events)) this.deliver(account, message.events);
  }

  /** @param {Account} account @param {any[]} events */
  deliver(account, events) {
    for (const event of events) for (const listener of account.liveListeners) listener(event);
  }

  /**
   * The leader's work until its account stops: push what is waiting, then hold the stream.
   * @param {Account} account
   */
  async lead(account) {
    const { signal } = account.stopped;
    this.schedulePush(0);
    // A "recorded" message can be lost (a tab closed as it posted, a leader change between
    // the write and the message): the outbox is looked at again when the page becomes
    // visible and every `pendingCheckInterval` ms.
    const check = () => this.pushIfPending(account);
    const onVisible = () => {
      if (document.visibilityState === 'visible') check();
    };
    const timer = setInterval(check, this.pendingCheckInterval);
    if (typeof document !== 'undefined') document.addEventListener('visibilitychange', onVisible);
    signal.addEventListener('abort', () => {
      clearInterval(timer);
      if (typeof document !== 'undefined') document.removeEventListener('visibilitychange', onVisible);
    });
    if (this.live) await this.stream(account);
    else await new Promise((resolve) => signal.addEventListener('abort', resolve));
  }

  /**
   * Holds `/sync/v1/stream` with `Last-Event-ID`, reconnecting after any end, refreshing the
   * token when it expired, honouring Retry-After and the stream's `retry:`; each event goes
   * to every tab. A stream silent for `streamIdleTimeout` (no keep-alive: a dead connection)
   * is dropped and reopened; one that is not `text/event-stream`, or ends soon without an
   * event, counts as a failure (backoff), so a broken answer never turns into a hot loop.
   * @param {Account} account
   */
  async stream(account) {
    const { signal } = account.stopped;
    const db = await account.db().catch(() => null);
    if (!db) return;
    let lastSeq = await this.streamStart(account, db).catch(() => null);
    if (lastSeq === null) return;
    let attempt = 0;
    let refused = false; // the last answer was a 401
    while (!signal.aborted) {
      let wait = 0;
      const watchdog = new Deadline(signal, this.streamIdleTimeout);
      try {
        const token = await this.accessToken();
        const response = await this.fetch(`${this.url}/sync/v1/stream?after=${lastSeq}`, {
          headers: { Authorization: `Bearer ${token}`, Accept: 'text/event-stream', 'Last-Event-ID': String(lastSeq) },
          cache: 'no-store',
          signal: watchdog.signal,
        });
        // Only the server's own 401 (its JSON error) is about the token; a 401 page of
        // something in the way is a failure like any other page (backoff, no refresh).
        let refusal = false;
        if (response.status === 401) {
          const { text } = await readAnswer(response, MAX_STREAM_MESSAGE);
          try {
            refusal = isServerError(JSON.parse(text));
          } catch {
            // not JSON: not the server's
          }
        }
        // A 401 right after the refresh the last one led to: fresh tokens are refused too.
        const refusedAgain = refused && refusal;
        refused = refusal;
        const type = (response.headers.get('Content-Type') ?? '').toLowerCase();
        if (refusal) {
          await this.refresh(token);
          // The first 401 (an expired token) reconnects at once with the new token; another
          // right after backs off, so a server that refuses every token is not hammered.
          if (refusedAgain) wait = backoffDelay(attempt++, this.retry);
        } else if (!response.ok || !response.body || !type.startsWith('text/event-stream')) {
          await response.body?.cancel().catch(() => {});
          const retryAfter = parseRetryAfter(response.headers.get('Retry-After'), response.headers.get('Date'));
          wait = retryAfter !== null ? this.retryAfterWait(retryAfter) : backoffDelay(attempt++, this.retry);
          this.emitState(
            'live_failed',
            response.ok
              ? new TrunkSyncError('invalid_response', `the live stream was answered ${type || 'without a type'}`, {
                  status: response.status,
                })
              : new TrunkSyncError(`http_${response.status}`, `the live stream was answered ${response.status}`, {
                  status: response.status,
                  retryAfter: retryAfter ?? undefined,
                }),
          );
        } else {
          const opened = Date.now();
          let delivered = false;
          const parser = new SSEParser();
          const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
          for (;;) {
            const { value, done } = await reader.read();
            if (done) break;
            watchdog.reset();
            const events = [];
            let unreadable = null;
            for (const message of parser.push(value)) {
              if (message.event !== 'event') continue;
              const event = streamEvent(message.data);
              if (!event) {
                unreadable = message.data;
                break;
              }
              if (event.seq <= lastSeq) continue;
              events.push(event);
              lastSeq = event.seq;
            }
            // The events before a message it cannot read are delivered first: the stream is
            // reopened after the last of them, so none is skipped. (They were not, and the
            // reopened stream started past them.)
            if (events.length > 0) {
              delivered = true;
              this.deliver(account, events);
              account.post({ kind: 'live', events });
              const seq = lastSeq;
              transact(db, ['meta'], 'readwrite', (tx) => tx.objectStore('meta').put(seq, 'live')).catch(() => {});
            }
            if (unreadable !== null) {
              reader.cancel().catch(() => {});
              throw new TrunkSyncError(
                'invalid_response',
                `a message of the live stream is not an event: ${unreadable.slice(0, 80)}`,
              );
            }
            // A line or message that never ends (each piece resets the watchdog) would hold
            // the stream, and grow, for good.
            if (parser.pending > MAX_STREAM_MESSAGE) {
              reader.cancel().catch(() => {});
              throw new TrunkSyncError(
                'invalid_response',
                `a message of the live stream runs past ${MAX_STREAM_MESSAGE} characters: not the server's`,
              );
            }
          }
          // A clean end (token expired, server shutting down): reconnect after the stream's
          // `retry:`; after backoff too when it brought nothing and did not last.
          const floor = Math.min(parser.retry ?? 0, this.retry.maxRetryAfter);
          if (delivered || Date.now() - opened >= this.streamIdleTimeout) {
            attempt = 0;
            wait = floor;
          } else {
            wait = Math.max(floor, backoffDelay(attempt++, this.retry));
          }
        }
      } catch (error) {
        if (signal.aborted) return;
        if (error instanceof TrunkSyncError && error.code === 'session_expired') return;
        wait = backoffDelay(attempt++, this.retry);
        this.emitState(
          'live_failed',
          error instanceof TrunkSyncError
            ? error
            : new TrunkSyncError(
                'network',
                watchdog.expired
                  ? `the live stream was silent for ${this.streamIdleTimeout} ms`
                  : `the live stream broke off: ${String(error)}`,
              ),
        );
      } finally {
        watchdog.clear();
      }
      if (wait > 0) await sleep(wait, signal);
    }
  }

  /**
   * Where the leader's stream starts: after the last event delivered live in this browser,
   * else after the `sync` cursor. With neither (a first sign-in here, or the first since a
   * sign-out), it waits until a `sync(handler)` in any tab has pulled to the end, and starts
   * after that cursor: the history comes once, by the pull, not a second time over the
   * stream while the pull runs (what commits meanwhile the stream still replays, after the
   * cursor). Null when the account stopped first.
   * @param {Account} account @param {IDBDatabase} db @returns {Promise<number | null>}
   */
  async streamStart(account, db) {
    const { signal } = account.stopped;
    const meta = (/** @type {string} */ key) => settled(db.transaction('meta').objectStore('meta').get(key));
    for (;;) {
      // Listening before looking: a pull that ends in between is not missed.
      const pulled = new Promise((resolve) => {
        account.pulled = () => resolve(undefined);
        signal.addEventListener('abort', () => resolve(undefined), { once: true });
      });
      /** @type {number | undefined} */
      const start = storedSeq(await meta('live')) ?? storedSeq(await meta('cursor'));
      if (start !== undefined) return start;
      await pulled;
      if (signal.aborted) return null;
    }
  }

  /**
   * Events as they commit on the server (from the leader tab's stream), in every tab, as an
   * async iterator of event objects, for the user signed in when it is called: it ends
   * (done) when that user signs out or another user is signed in (in any tab), so no other
   * user's events reach it; called while nobody is signed in, it ends at once. `return()`
   * (a `break` in `for await`) ends it too. It gets events from when it is called: after the
   * `sync` that catches up, open it, `sync` once more, then read it. On a first sign-in in
   * this browser the stream starts once a `sync(handler)` pulled to the end (see
   * `streamStart`): nothing comes before.
   * @returns {AsyncIterableIterator<any>}
   */
  liveEvents() {
    const account = this.account;
    /** @type {any[]} */
    const queue = [];
    /** @type {((result: IteratorResult<any>) => void) | null} */
    let waiting = null;
    let ended = false;
    const listener = (/** @type {any} */ event) => {
      if (waiting) {
        const resolve = waiting;
        waiting = null;
        resolve({ value: event, done: false });
      } else queue.push(event);
    };
    const end = () => {
      ended = true;
      account?.liveListeners.delete(listener);
      account?.stopped.signal.removeEventListener('abort', end);
      if (waiting) waiting({ value: undefined, done: true });
      waiting = null;
      return Promise.resolve({ value: undefined, done: true });
    };
    if (account && !account.stopped.signal.aborted) {
      account.liveListeners.add(listener);
      account.stopped.signal.addEventListener('abort', end);
    } else ended = true;
    return {
      next: () => {
        if (queue.length > 0) return Promise.resolve({ value: queue.shift(), done: false });
        if (ended) return Promise.resolve({ value: undefined, done: true });
        return new Promise((resolve) => {
          waiting = resolve;
        });
      },
      return: end,
      [Symbol.asyncIterator]() {
        return this;
      },
    };
  }

  // MARK: Sign-out and account

  /**
   * Signs out: pushes once, revokes the session and forgets it here. Unsent events stay in
   * this user's outbox (counted in `unsentEvents`) unless `discard` is true. It ends the
   * session it was called for: should another tab sign in meanwhile, that tab's session
   * is left as it is, and when that is the same user, so are the outbox and cursor (theirs
   * now: nothing is discarded).
   * @param {{discard?: boolean}} [options]
   */
  async signOut(options = {}) {
    const account = this.current();
    const session = this.session;
    const pin = { user_id: session.user_id, id: session.id };
    try {
      // One try, no waiting: signing out offline must not hang on backoff.
      await navigator.locks.request(`trunk-sync|sync|${account.key}`, () => this.pushAll(account, { retry: false }));
    } catch {
      // offline or refused: the events stay
    }
    const logout = '/auth/v1/logout?scope=local';
    try {
      await this.request('POST', logout, { retry: false, pin });
    } catch (error) {
      // Another tab signed in meanwhile: this session is revoked with its own last token.
      if (error instanceof TrunkSyncError && error.code === 'user_changed') {
        await this.request('POST', logout, { retry: false, token: session.access_token }).catch(() => {});
      }
      // Otherwise the local session goes anyway.
    }
    // Should another tab have signed the same user in again meanwhile, this outbox and
    // cursor are that session's now (it may have recorded already): nothing is deleted.
    const stored = this.readSession();
    const clear = !stored || stored.user_id !== pin.user_id || matchesPin(stored, pin);
    const key = cleanupKey(this.url, pin.user_id);
    // A discard (or deletion) still pending from before is kept, never weakened.
    const previous = pendingCleanup(key);
    const discard = options.discard === true || previous === 'discard';
    // Written first: should IndexedDB not do it now, the next opening does (see cleanupKey).
    if (clear && previous !== 'delete') setCleanup(key, discard ? 'discard' : 'forget');
    /** @type {number | null} */
    let unsentEvents = null;
    try {
      // A connection of its own: another tab's sign-in closes the account's.
      const db = await openDatabase(`trunk-sync|${account.key}`);
      try {
        unsentEvents = await settled(db.transaction('outbox').objectStore('outbox').count());
        if (clear && previous !== 'delete') {
          await clearUserData(db, discard);
          if (discard) unsentEvents = 0;
          setCleanup(key, null);
        }
      } finally {
        db.close();
      }
    } catch {
      // IndexedDB will not open or commit: signed out all the same, the clean-up pending.
    }
    if (matchesPin(this.readSession(), pin)) this.storeSession(null);
    else this.openAccount();
    return { unsentEvents };
  }

  /**
   * Mails the user a confirmation code for `deleteAccount`: for the user signed in now
   * (`user_changed` if another tab signs someone else in before it is sent).
   */
  async reauthenticate() {
    const account = this.current();
    await this.request('POST', '/auth/v1/reauthenticate', { retry: false, pin: { user_id: account.userId } });
  }

  /**
   * Deletes the account and all its data on the server with the mailed code, then
   * everything kept here for the user; for the user signed in now (`user_changed`, nothing
   * deleted, if another tab signs someone else in before it is sent). @param {string} code
   */
  async deleteAccount(code) {
    const account = this.current();
    const pin = { user_id: account.userId };
    /** @type {TrunkSyncError | null} */
    let unknown = null;
    // A token refresh first, on its own: one that fails has sent nothing.
    await this.accessToken(pin);
    try {
      await this.request('DELETE', '/sync/v1/account', { body: { code }, retry: false, pin });
    } catch (error) {
      // The server's own refusal (a 4xx: wrong code, …), or never sent: nothing deleted.
      if (!(error instanceof TrunkSyncError) || error.code === 'user_changed' || error.code === 'not_signed_in') throw error;
      if (error.status >= 400 && error.status < 500) throw error;
      // No answer (or a 5xx): the server may have deleted the account. Not claimed done,
      // but the user's data does not stay here for whoever uses this browser next.
      unknown = error;
      await this.request('POST', '/auth/v1/logout?scope=local', { retry: false, pin }).catch(() => {});
    }
    const key = cleanupKey(this.url, account.userId);
    setCleanup(key, 'delete');
    // Signed out here, unless another tab signed someone else in meanwhile.
    const stored = this.readSession();
    if (!stored || stored.user_id === account.userId) this.storeSession(null);
    else account.stop();
    let local = null;
    try {
      await deleteDatabase(`trunk-sync|${account.key}`);
      setCleanup(key, null);
    } catch (error) {
      local = error; // deleted when a client next starts here (see cleanupKey)
    }
    if (unknown) {
      throw new TrunkSyncError(
        'outcome_unknown',
        `the server's answer to the deletion was lost (${unknown.message}): the account may or may not ` +
          'be deleted; signed out, and its data here removed. Sign in again to see whether it still exists',
        { status: unknown.status },
      );
    }
    if (local) {
      throw new TrunkSyncError(
        'storage_unavailable',
        `the account is deleted; its data in this browser could not be deleted yet (${String(local)}): ` +
          'that happens when the client next starts here',
      );
    }
  }

  /**
   * The user's account and events as an NDJSON Blob (`GET /sync/v1/export`). The body may
   * pause at most `requestTimeout` between pieces (a large export takes as long as it
   * needs); a download that stalls longer is aborted (`network`). A `200` that is not NDJSON
   * (a page of something in the way) is refused (`invalid_response`). A body that is not a
   * whole export (`ExportCheck`: no end line, one whose count or last seq is not what came,
   * event lines whose seqs do not increase, or anything after it: cut short where the break
   * did not show, or put together wrong) is refused
   * (`incomplete_export`) and nothing of it is handed out.
   */
  async exportData() {
    const { response, deadline } = await this.request('GET', '/sync/v1/export', { raw: true, retry: false });
    // A 200 page of something in the way (a captive portal, a proxy set up wrong) is not the
    // copy. (It was handed out as the export.)
    const type = response.headers.get('Content-Type') ?? '';
    if (type.split(';')[0].trim().toLowerCase() !== 'application/x-ndjson') {
      deadline.clear();
      response.body?.cancel().catch(() => {});
      throw new TrunkSyncError(
        'invalid_response',
        `the export was answered ${type || 'without a type'}, not NDJSON: not the server's copy`,
        { status: response.status },
      );
    }
    /** @type {Uint8Array[]} */
    const chunks = [];
    const check = new ExportCheck();
    /** @type {ReadableStreamDefaultReader<Uint8Array> | undefined} */
    let reader;
    try {
      deadline.reset();
      reader = response.body.getReader();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        deadline.reset();
        chunks.push(value);
        check.push(value);
      }
      check.finish();
    } catch (error) {
      if (error instanceof TrunkSyncError) {
        reader?.cancel().catch(() => {});
        throw error;
      }
      throw new TrunkSyncError(
        'network',
        deadline.expired
          ? `the export stalled: nothing came for ${this.requestTimeout} ms, so it was aborted`
          : `the export was cut off: ${String(error)}`,
      );
    } finally {
      deadline.clear();
    }
    return new Blob(chunks, { type: response.headers.get('Content-Type') ?? '' });
  }

  /** Stops this client's work in this tab (leadership passes to another tab). */
  close() {
    this.closed = true;
    this.account?.stop();
    this.account = null;
  }
}
