// Types of trunk-sync's browser client (trunk-sync.js). Guide: docs/web-client.md.

/** An event as the server returns it (pull, live stream, sync handler). */
export interface SyncEvent {
  /** The server's id of the event. */
  id: string;
  /** Its position in the user's log: 1, 2, 3, …, increasing (consecutive but once across a restore of the server's database, which moves it far ahead). */
  seq: number;
  /** The id `record` returned; the same on every device. */
  client_id: string;
  type: string;
  payload: Record<string, unknown>;
  /** RFC 3339, when `record` was called. */
  client_timestamp: string;
  /** RFC 3339, when the server stored it. */
  created_at: string;
}

export interface RetryOptions {
  /** Tries per call (network failures, 408, 429, 500, 502, 503, 504). Default 6. */
  maxAttempts?: number;
  /** Backoff: random between 0 and min(maxDelay, baseDelay · 2^attempt) ms. Default 500. */
  baseDelay?: number;
  /** Default 30000 ms. */
  maxDelay?: number;
  /**
   * A Retry-After longer than this (ms) is not waited out: `rate_limited`; the leader's
   * background push and stream wait this long, then try again. Default 120000.
   */
  maxRetryAfter?: number;
}

export interface TrunkSyncOptions {
  /** The server's base URL, e.g. `https://sync.example.com`. */
  url: string;
  /** Events per push, a whole number from 1 to 1000 (the server's limit; outside, the nearest; not a whole number: a `TypeError`). Default 500. */
  maxBatchEvents?: number;
  /** Payload bytes per push, at most 5 MiB (half the server's 10 MiB). Default 4 MiB. */
  maxBatchBytes?: number;
  /** Events per pulled page, a whole number from 1 to 1000 (outside, the nearest; not a whole number: a `TypeError`). Default 1000. */
  pageSize?: number;
  retry?: RetryOptions;
  /** Refresh the access token this many seconds before it expires (at most half its life). Default 60. */
  refreshMargin?: number;
  /**
   * Ms a request may take (head and body) before it counts as a network failure; the body of
   * `exportData` may take as long as it needs but pause at most this long. Default 30000.
   */
  requestTimeout?: number;
  /**
   * Bytes of an answer's body read at most (all but the export's and the live stream's): a
   * body past it (or announced past it by its `Content-Length`) is cancelled unread and the
   * call fails as for an answer that is not the server's (`invalid_response` for a `2xx`,
   * `http_<status>` otherwise). The server's answers are far smaller (a pulled page ~1.1 MiB
   * at most). Default 32 MiB; anything but a positive whole number is a `TypeError`.
   */
  maxAnswerBytes?: number;
  /**
   * Ms the live stream may stay silent before it is dropped and reopened; keep it above twice
   * the server's `TRUNK_SYNC_STREAM_HEARTBEAT` (15 s). Default 35000.
   */
  streamIdleTimeout?: number;
  /**
   * Ms between the leader's looks at the outbox, which push what a lost "recorded" message
   * did not announce (also done when the page becomes visible). Default 60000.
   */
  pendingCheckInterval?: number;
  /** The leader tab holds the live stream (`/sync/v1/stream`). Default true. */
  live?: boolean;
  /** The leader tab pushes soon after any tab records. Default true. */
  autoPush?: boolean;
  /** The fetch to use (tests). Default `globalThis.fetch`. */
  fetch?: typeof fetch;
}

export interface SyncReport {
  /** Events the server stored now. */
  pushed: number;
  /** Events the server already had (a push whose answer was lost, sent again). */
  duplicates: number;
  /** Events handed to the handler. */
  pulled: number;
  /**
   * Events the server refused, moved to the quarantine; also outbox records the client
   * could not send (field `record`) or the browser could not read (field `unreadable`).
   */
  rejected: RefusedEvent[];
}

export interface RefusedEvent {
  client_id: string;
  type: string;
  /**
   * The field the server named, e.g. `payload`; `record` for an outbox record the client
   * could not send at all, `unreadable` for one the browser could not read (see
   * `QuarantinedEvent`).
   */
  field: string;
  reason: string;
}

/**
 * An event in the quarantine: what was recorded and why the server refused it. Field
 * `record`: an outbox record the client could not send (its `client_id`, `type` or
 * `client_timestamp` not a string, its payload not a plain object or without a JSON form:
 * written by something else than `record`), kept as it was found, with any other fields it
 * had; under `unreadable-<n>` when it had no string `client_id`. Its `payload` may then not
 * be JSON.
 *
 * Field `unreadable`: what is left of a record the browser could not read (Chrome keeps a
 * value over ~64 KiB in a file of its own in the profile; that file lost or damaged, the read
 * fails with `NotReadableError` or `UnknownError`). Its content is gone: `type`,
 * `client_timestamp` empty, `payload` `{}`, the browser's error in `reason`. For an outbox
 * record (set aside by the push, at once when its file is missing, after its reads failed
 * for 10 minutes across pushes otherwise; told once in `rejected`): under `unreadable-<n>`, with
 * `outbox_key` n. For a quarantine entry (listed as found, not stored): under its own key,
 * `quarantined_at` empty. `requeueQuarantined` leaves it; `discardQuarantined` drops it.
 */
export interface QuarantinedEvent {
  client_id: string;
  type: string;
  payload: Record<string, unknown>;
  client_timestamp: string;
  field: string;
  reason: string;
  /** RFC 3339 (empty for a quarantine entry the browser cannot read). */
  quarantined_at: string;
  /** Field `unreadable`, for an outbox record: its key in the outbox. */
  outbox_key?: number;
}

/**
 * What the client throws. `code`: `storage_unavailable` (IndexedDB cannot be opened: nothing
 * recorded), `not_signed_in`, `session_expired` (the server ended the session: sign in again;
 * the outbox stays), `network`, `rate_limited` (`retryAfter` ms), `invalid_event` (refused by
 * `record` itself), `invalid_response` (an answer that is not the server's, e.g. a 2xx push
 * answer that does not name the events stored: they stay in the outbox), `unsupported`,
 * `outcome_unknown` (`deleteAccount` got no answer: the account may or may not be deleted;
 * signed out and its local data removed all the same), `incomplete_export` (`exportData` got
 * a body that is not a whole export: no end line, one that does not match what came, or
 * something after it; nothing is handed out: export again),
 * `cancelled`, `user_changed` (another tab signed someone else in while a call for the
 * user before was under way: nothing was sent with the other user's session), or the
 * server's error code (`otp_expired`,
 * `reauthentication_not_valid`, …) with `status`; `http_<status>` for an error answer that
 * is not the server's JSON (a proxy's page: `fromServer` false).
 */
export class TrunkSyncError extends Error {
  readonly code: string;
  /** The HTTP status, 0 when there was no answer. */
  readonly status: number;
  readonly details?: unknown;
  /** Milliseconds the server asked to wait (Retry-After). */
  readonly retryAfter?: number;
  /**
   * The answer was the server's own error (JSON with its `code` or `error_code`), not a
   * page of something in between (a proxy set up wrong, a captive portal): only such an
   * answer ends a session or quarantines an event.
   */
  readonly fromServer: boolean;
}

/** What `onStateChange` tells: `(state, detail)`, the detail's type following the state. */
export type StateChange =
  | [state: 'leader' | 'signed_out' | 'pushed' | 'storage_not_persisted', detail?: undefined]
  | [state: 'push_failed' | 'live_failed', detail: TrunkSyncError]
  | [state: 'rejected', detail: RefusedEvent[]];

export class TrunkSyncClient {
  constructor(options: TrunkSyncOptions);
  /** The server's base URL as given, without a trailing slash. */
  readonly url: string;
  /** A session is stored for this server (also after a reload, in every tab). */
  readonly isSignedIn: boolean;
  /** The signed-in user, or null. */
  readonly user: { id: string; email: string | null } | null;
  /** This tab is the account's leader: it pushes, and holds the live stream. */
  readonly isLeader: boolean;
  /**
   * Whether the browser granted persistent storage (`navigator.storage.persist()`, asked at
   * the first sign-in of this page): `false` means it may clear this origin's storage,
   * unsent events included, under storage pressure (tell the user: install the app,
   * bookmark it, sync before leaving); `null` until it answered, or where it is not offered.
   * `onStateChange` tells `'storage_not_persisted'` when it turns false.
   */
  readonly storagePersisted: boolean | null;

  /** Mails a 6-digit code (POST /auth/v1/otp). Not repeated after a network failure. */
  sendCode(email: string): Promise<void>;
  /** Signs in with the mailed code; the session is stored for this server. */
  verify(email: string, code: string): Promise<void>;

  /**
   * Records an event; resolves with its client_id once the event is committed to IndexedDB
   * with strict durability. Rejects with `storage_unavailable` when storage cannot be opened.
   */
  record(type: string, payload: Record<string, unknown>): Promise<string>;
  /** Events recorded and not yet stored by the server (quarantined ones excluded). */
  pendingCount(): Promise<number>;
  /**
   * Pushes the outbox, then, given a `handler`, pulls every page after the stored cursor:
   * `handler` gets each page in seq order and the cursor is stored only after it returned (at
   * least once). Without a handler it only pushes (`pulled` 0, the cursor unchanged).
   */
  sync(handler?: (events: SyncEvent[]) => unknown | Promise<unknown>): Promise<SyncReport>;
  /**
   * Events as they commit on the server, in every tab (from the leader's stream), for the
   * user signed in when called: it ends when that user signs out or another is signed in
   * (in any tab); called with nobody signed in, it ends at once. It gets events from when it
   * is called: after the `sync` that catches up, open it, `sync` once more (what committed as
   * the first ended), then read it (skip `seq`s both bring). On a first sign-in in this
   * browser (or the first since a sign-out) the leader opens its stream only once a
   * `sync(handler)`, in any tab, pulled to the end, and after that sync's cursor: the
   * history comes once, by the pull; an iterator opened before gets nothing until then.
   */
  liveEvents(): AsyncIterableIterator<SyncEvent>;

  /**
   * The quarantine, oldest first: events the server refused, outbox records the client could
   * not send, what is left of records the browser could not read (entries it cannot read
   * now among them, first, rather than the call failing).
   */
  quarantinedEvents(): Promise<QuarantinedEvent[]>;
  /**
   * Puts quarantined events back in the outbox, same ids. Entries that hold no event (field
   * `unreadable`, or one the browser cannot read now) stay, the others go all the same.
   */
  requeueQuarantined(clientIds: string[]): Promise<void>;
  /** Drops quarantined events for good. */
  discardQuarantined(clientIds: string[]): Promise<void>;

  /**
   * Pushes once, revokes the session and forgets it here. Unsent events stay in this user's
   * outbox for the next sign-in (counted) unless `discard` is true. Ends the session it was
   * called for: one another tab signs in meanwhile is left as it is, and when that is the
   * same user, so are the outbox and cursor (theirs now: nothing is discarded). Offline,
   * or with IndexedDB refusing, it still signs out here; `unsentEvents` is then null when
   * the database could not be opened to count them, and forgetting the cursor (and the
   * discard) happens at the next opening of that user's database, before anything else.
   */
  signOut(options?: { discard?: boolean }): Promise<{ unsentEvents: number | null }>;
  /**
   * Mails a confirmation code for `deleteAccount`, to the user signed in when called
   * (`user_changed` if another tab signs someone else in before it is sent).
   */
  reauthenticate(): Promise<void>;
  /**
   * Deletes the account and its data on the server, then everything kept here for the user;
   * the user signed in when called (`user_changed`, nothing deleted, if another tab signs
   * someone else in before it is sent). The server's refusal (a wrong code: its 4xx)
   * deletes nothing anywhere. No answer (a network failure, a timeout, a 5xx): rejects
   * with `outcome_unknown`, never claiming the deletion, but signs out and removes the
   * user's data here all the same (unsent events included), so the next person using this
   * browser cannot read it; signing in again tells whether the account still exists.
   * Resolved, the local database is gone too; if the browser refuses to delete it, rejects
   * with `storage_unavailable` (the account is deleted) and it is deleted when a client
   * next starts here.
   */
  deleteAccount(code: string): Promise<void>;
  /**
   * The account and its events, NDJSON (GET /sync/v1/export), ending with the end line
   * `{"kind":"end","events":N,"last_seq":S}`. A body that stops coming for `requestTimeout`
   * is aborted: `network`. A `200` that is not NDJSON (a captive portal's or a proxy's page)
   * is refused: `invalid_response`. A body without the end line, whose end line's count or
   * last seq is not that of the event lines that came, whose event lines' seqs do not
   * increase (a page missing and another repeated), or with anything after it (cut short
   * where the break did not show, e.g. by a proxy) is refused: `incomplete_export`; nothing
   * of it is handed out.
   */
  exportData(): Promise<Blob>;
  /**
   * Tells the app what happens in the background; returns an unsubscribe. `'leader'`: this
   * tab became the leader. `'signed_out'`: the session ended, however (`signOut`,
   * `deleteAccount`, a refresh the server refused, another tab). `'push_failed'`: the
   * leader's push failed and will be tried again (`detail`: the error). `'rejected'`: the
   * leader's push moved events the server refused, or outbox records it could not send
   * (field `record`) or the browser could not read (field `unreadable`), to the quarantine
   * (`detail`: them); so does any push, `sync()`'s too, that failed after it moved some
   * (its report lost with the error). `'live_failed'`: the leader's live
   * stream failed (no answer, a page in the way, a message it cannot read, silence) and is
   * reopened after a backoff (`detail`: the error). `'pushed'`: in every tab, a push (any
   * tab's) took events out of the outbox, the server having stored them: `pendingCount()` is
   * smaller. `'storage_not_persisted'`: the browser refused persistent storage
   * (`storagePersisted`).
   */
  onStateChange(listener: (...change: StateChange) => void): () => void;
  /** Stops this client's work in this tab (another tab becomes the leader). */
  close(): void;
}

/** Pure helpers, exported for tests. */
export function backoffDelay(attempt: number, policy: { baseDelay: number; maxDelay: number }, random?: () => number): number;
export function isServerError(body: unknown): boolean;
export function parseRetryAfter(value: string | null | undefined, date?: string | null, now?: number): number | null;
export function retryAfterDelay(ms: number, random?: () => number): number;
export function firstBatch<T extends { bytes: number }>(records: T[], limits: { maxEvents: number; maxBytes: number }): T[];
export function utf8Length(text: string): number;
export function refusedEvents(body: unknown, count: number): Map<number, { field: string; reason: string }>;
export function checkedPage(page: unknown, cursor: number): { events: SyncEvent[]; next_after: number; has_more: boolean };
export function pushResults(body: unknown): Map<string, 'created' | 'duplicate'> | null;
export function outboxProblem(record: unknown, serialize?: boolean): string | null;
export function streamEvent(data: string): SyncEvent | null;
export function storedSeq(value: unknown): number | undefined;
/**
 * Whether an IndexedDB read failed for its record (`NotReadableError`, `NotFoundError`,
 * `UnknownError`, `DataError`).
 */
export function unreadableValue(error: unknown): boolean;
/**
 * Whether such a failure says the value is gone for good (its file missing:
 * `NotReadableError`, or `NotFoundError` in Chrome 12x–129); Chrome's other failures
 * (`UnknownError`, older `DataError`) are likely transient.
 */
export function valueLost(error: unknown): boolean;
/**
 * Reads each key with `read`, once more those that failed: the values (in key order, none
 * for `undefined`) and the keys that failed twice with `unreadableValue`; rejects with any
 * other failure.
 */
export function readEach(
  keys: IDBValidKey[],
  read: (key: IDBValidKey) => Promise<unknown>,
): Promise<{ values: any[]; unreadable: { key: IDBValidKey; error: unknown }[] }>;
/** What the quarantine holds, or lists, for a record the browser cannot read (field `unreadable`). */
export function unreadableEntry(
  store: 'outbox' | 'quarantine',
  key: IDBValidKey,
  error: unknown,
  now: string,
): QuarantinedEvent;
/**
 * `options[name]` as a time in milliseconds, from 1000 to 2^31 − 1 (what a timer takes), or
 * `fallback` when unset; anything else throws a `TypeError` (the constructor's
 * `requestTimeout`, `streamIdleTimeout` and `pendingCheckInterval`).
 */
export function milliseconds(options: Record<string, unknown>, name: string, fallback: number): number;
/**
 * `options[name]` as a whole number of events from 1 to `max` (outside, the nearest), or
 * `fallback` when unset; anything else throws a `TypeError` (the constructor's
 * `maxBatchEvents` and `pageSize`).
 */
export function eventCount(options: Record<string, unknown>, name: string, fallback: number, max: number): number;
/** Checks an export's body piece by piece (see `exportData`); throws `incomplete_export`. */
export class ExportCheck {
  /** Whole lines read. */
  readonly lines: number;
  /** Event lines read. */
  readonly events: number;
  push(piece: Uint8Array): void;
  /** What the end line says, once the body has ended. */
  finish(): { events: number; last_seq: number };
}
/** The `seq` of an export's event line, read from its first members; throws `incomplete_export`. */
export function exportSeq(bytes: Uint8Array, what: string): number;
export function readAnswer(
  response: { headers: { get(name: string): string | null }; body: ReadableStream<Uint8Array> | null },
  limit: number,
): Promise<{ text: string; cutOff: boolean }>;
export class SSEParser {
  lastEventId: string;
  retry: number | null;
  /** Characters of the message being read (its data lines and the line not ended yet). */
  readonly pending: number;
  push(text: string): { id: string; event: string; data: string }[];
}
