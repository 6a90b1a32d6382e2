// The browser client's pure parts under Node's built-in test runner:
//   node --test clients/web/test/
// (the browser parts are tested in headless Chromium: Tests/Browser/web_client.py).
import assert from 'node:assert/strict';
import { test } from 'node:test';

import {
  ExportCheck,
  SSEParser,
  backoffDelay,
  checkedPage,
  firstBatch,
  isServerError,
  milliseconds,
  eventCount,
  exportSeq,
  outboxProblem,
  parseRetryAfter,
  pushResults,
  readAnswer,
  readEach,
  refusedEvents,
  retryAfterDelay,
  storedSeq,
  streamEvent,
  unreadableEntry,
  unreadableValue,
  utf8Length,
  valueLost,
} from '../trunk-sync.js';

test('backoff is full jitter, doubling up to the cap', () => {
  const policy = { baseDelay: 500, maxDelay: 30000 };
  assert.equal(backoffDelay(0, policy, () => 0.999999), 499.9995);
  assert.equal(backoffDelay(3, policy, () => 1), 4000);
  assert.equal(backoffDelay(10, policy, () => 1), 30000);
  assert.equal(backoffDelay(1000, policy, () => 1), 30000); // no overflow to Infinity
  assert.equal(backoffDelay(2, policy, () => 0), 0);
  for (let attempt = 0; attempt < 12; attempt++) {
    const delay = backoffDelay(attempt, policy);
    assert.ok(delay >= 0 && delay <= Math.min(30000, 500 * 2 ** attempt));
  }
});

test('Retry-After in seconds or as a date; absent or unreadable is null', () => {
  assert.equal(parseRetryAfter('2'), 2000);
  assert.equal(parseRetryAfter(' 120 '), 120000);
  const now = Date.parse('2026-11-26T12:00:00Z');
  assert.equal(parseRetryAfter('Thu, 26 Nov 2026 12:00:05 GMT', null, now), 5000);
  assert.equal(parseRetryAfter('Thu, 26 Nov 2026 11:00:00 GMT', null, now), 0);
  // A date is counted from the answer's own Date, not from this device's clock (here a
  // clock 26 years behind, then hours ahead); an unreadable Date falls back to the clock.
  assert.equal(parseRetryAfter('Sat, 01 Jan 2000 00:00:30 GMT', 'Sat, 01 Jan 2000 00:00:00 GMT', now), 30000);
  assert.equal(parseRetryAfter('Thu, 26 Nov 2026 09:00:30 GMT', 'Thu, 26 Nov 2026 09:00:00 GMT', now), 30000);
  assert.equal(parseRetryAfter('Thu, 26 Nov 2026 12:00:05 GMT', 'yesterday', now), 5000);
  assert.equal(parseRetryAfter(null), null);
  assert.equal(parseRetryAfter('soon'), null);
  assert.equal(parseRetryAfter('-1'), null);
});

test('a Retry-After wait is exactly it plus at most 10 % jitter', () => {
  assert.equal(retryAfterDelay(2000, () => 0), 2000);
  assert.equal(retryAfterDelay(2000, () => 1), 2200);
});

test('batches stay within the event and byte limits, oldest first, never empty', () => {
  const records = Array.from({ length: 10 }, (_, n) => ({ n, bytes: 100 }));
  assert.deepEqual(firstBatch(records, { maxEvents: 4, maxBytes: 1e6 }).map((r) => r.n), [0, 1, 2, 3]);
  assert.deepEqual(firstBatch(records, { maxEvents: 100, maxBytes: 250 }).map((r) => r.n), [0, 1]);
  // One event over the byte limit still goes alone (the server judges it).
  assert.deepEqual(firstBatch([{ n: 0, bytes: 500 }, { n: 1, bytes: 1 }], { maxEvents: 10, maxBytes: 100 }).map((r) => r.n), [0]);
  assert.deepEqual(firstBatch([], { maxEvents: 10, maxBytes: 100 }), []);
});

test('payload bytes are counted as UTF-8', () => {
  assert.equal(utf8Length('{"a":"é"}'), 10);
  assert.equal(utf8Length('😀'), 4);
});

test('SSE framing: ids, event names, multi-line data, comments, retry, any line ending, split chunks', () => {
  const parser = new SSEParser();
  const text = 'retry: 1000\n\n: keep-alive\n\nid: 1\nevent: event\ndata: {"seq":1}\n\n' +
    'id: 2\r\nevent: event\r\ndata: a\r\ndata: b\r\n\r\nid: 3\revent: event\rdata:c\r\r';
  const messages = [];
  // Fed one character at a time: nothing depends on where the chunks end.
  for (const character of text) messages.push(...parser.push(character));
  assert.equal(parser.retry, 1000);
  assert.deepEqual(messages, [
    { id: '1', event: 'event', data: '{"seq":1}' },
    { id: '2', event: 'event', data: 'a\nb' },
    { id: '3', event: 'event', data: 'c' },
  ]);
  // A message without data is not dispatched; the id is kept for the next one.
  assert.deepEqual(parser.push('id: 9\n\ndata: x\n\n'), [{ id: '9', event: 'message', data: 'x' }]);
  // An incomplete message waits for the rest.
  assert.deepEqual(parser.push('id: 10\nevent: event\ndata: {"seq"'), []);
  assert.deepEqual(parser.push(':10}\n\n'), [{ id: '10', event: 'event', data: '{"seq":10}' }]);
});

test('a 400 names the refused events by index, first problem each', () => {
  const refused = refusedEvents({
    code: 'validation_failed',
    details: [
      { index: 2, field: 'payload', reason: 'contains \\u0000' },
      { index: 2, field: 'type', reason: 'too long' },
      { index: 0, field: 'client_timestamp', reason: 'not RFC 3339' },
      { field: 'events', reason: 'no index' },
    ],
  }, 3);
  assert.deepEqual([...refused.keys()].sort(), [0, 2]);
  assert.deepEqual(refused.get(2), { field: 'payload', reason: 'contains \\u0000' });
  assert.equal(refusedEvents({ code: 'invalid_json' }, 3).size, 0);
  assert.equal(refusedEvents(null, 3).size, 0);
});

test('an index outside the batch names none of its events', () => {
  // Quarantining "index 3" of a batch of 1 would move nothing: the same batch would be
  // pushed again at once, and again, as long as the answer says so.
  const body = { details: [{ index: 3, field: 'payload', reason: 'x' }, { index: -1, field: 'type', reason: 'y' }] };
  assert.equal(refusedEvents(body, 1).size, 0);
  assert.deepEqual([...refusedEvents(body, 4).keys()], [3]);
});

test("only the server's own JSON error is the server's refusal", () => {
  assert.ok(isServerError({ code: 'validation_failed', message: 'x' })); // /sync/v1
  assert.ok(isServerError({ code: 400, error_code: 'refresh_token_not_found', msg: 'x' })); // /auth/v1
  for (const body of [null, 'Bad Request', [], {}, { code: 400 }, { message: 'down for maintenance' }]) {
    assert.equal(isServerError(body), false, JSON.stringify(body));
  }
});

test('a pull answer is taken only as the server gives it: after the cursor, in order', () => {
  const page = { events: [{ seq: 11 }, { seq: 12 }], next_after: 12, has_more: true };
  assert.deepEqual(checkedPage(page, 10), page);
  assert.deepEqual(checkedPage({ events: [], next_after: 10, has_more: false }, 10).events, []);
  // A restore on the server moves seqs far ahead: a jump is fine.
  assert.equal(checkedPage({ events: [{ seq: 1e15 }], next_after: 1e15, has_more: false }, 10).next_after, 1e15);
  for (const [bad, cursor] of [
    [null, 0], // a 204, or an empty 200
    [{}, 0], // a proxy's own JSON
    [{ events: [], has_more: false }, 0], // no next_after
    [{ events: [], next_after: 0, has_more: false }, 10], // the cursor back (a stale answer)
    [{ events: [{ seq: 10 }], next_after: 10, has_more: false }, 10], // not after the cursor
    [{ events: [{ seq: 12 }, { seq: 11 }], next_after: 12, has_more: false }, 10], // out of order
    [{ events: [{ seq: 12 }], next_after: 11, has_more: false }, 10], // next_after behind
    [{ events: [{}], next_after: 11, has_more: false }, 10], // no seq
    [{ events: [], next_after: 10, has_more: true }, 10], // more, but not past the cursor: asked forever
  ]) {
    assert.throws(() => checkedPage(bad, cursor), { name: 'TrunkSyncError', code: 'invalid_response' }, JSON.stringify(bad));
  }
});

test('a push answer names the events stored; anything else names none', () => {
  const answer = {
    accepted: 1,
    duplicates: 1,
    results: [
      { client_id: 'a', status: 'created', seq: 1 },
      { client_id: 'b', status: 'duplicate', seq: 2 },
      { client_id: 'c', status: 'refused' },
      { status: 'created' },
      null,
    ],
  };
  assert.deepEqual([...pushResults(answer)], [
    ['a', 'created'],
    ['b', 'duplicate'],
  ]);
  assert.equal(pushResults(null), null); // a 204
  assert.equal(pushResults({ accepted: 3, duplicates: 0 }), null);
  assert.equal(pushResults('ok'), null);
  assert.equal(pushResults({ results: [] }).size, 0);
});

test('SSE framing: a CR ending a chunk, then LF, then LF (the blank line) in separate chunks', () => {
  const parser = new SSEParser();
  const chunks = ['id: 1\r', '\n', 'data: {"seq":1}\r', '\n', '\n'];
  const messages = chunks.flatMap((chunk) => parser.push(chunk));
  assert.deepEqual(messages, [{ id: '1', event: 'message', data: '{"seq":1}' }]);
  const empty = new SSEParser();
  assert.deepEqual([...empty.push('data: x\r'), ...empty.push(''), ...empty.push('\n'), ...empty.push('\r\n')], [
    { id: '', event: 'message', data: 'x' },
  ]);
});

test('timing options are milliseconds from 1 s to what a timer takes, or the default', () => {
  assert.equal(milliseconds({}, 'requestTimeout', 30000), 30000);
  assert.equal(milliseconds({ requestTimeout: 5000 }, 'requestTimeout', 30000), 5000);
  for (const bad of [0, 999, -1, NaN, Infinity, 2147483648, '5000', null]) {
    assert.throws(() => milliseconds({ pendingCheckInterval: bad }, 'pendingCheckInterval', 60000), TypeError, String(bad));
  }
});

test('event counts are whole numbers, clamped to 1 and the most the server takes, or the default', () => {
  assert.equal(eventCount({}, 'pageSize', 1000, 1000), 1000);
  assert.equal(eventCount({ pageSize: 200 }, 'pageSize', 1000, 1000), 200);
  assert.equal(eventCount({ pageSize: 0 }, 'pageSize', 1000, 1000), 1, 'a page of none would be refused');
  assert.equal(eventCount({ pageSize: -5 }, 'pageSize', 1000, 1000), 1);
  assert.equal(eventCount({ maxBatchEvents: 5000 }, 'maxBatchEvents', 500, 1000), 1000);
  for (const bad of [2.5, NaN, Infinity, '200', null]) {
    assert.throws(() => eventCount({ pageSize: bad }, 'pageSize', 1000, 1000), TypeError, String(bad));
  }
});

test('an outbox record that cannot be sent is told apart from one that can', () => {
  const good = { n: 1, client_id: 'c1', type: 'note', payload: { text: 'hi' }, client_timestamp: 't', bytes: 13 };
  assert.equal(outboxProblem(good), null);
  const cycle = { text: 'x' };
  cycle.self = cycle;
  for (const [bad, why] of [
    [{ ...good, client_id: undefined }, /client_id/],
    [{ ...good, client_id: 7 }, /client_id/],
    [{ ...good, type: null }, /type/],
    [{ ...good, client_timestamp: 0 }, /client_timestamp/],
    [{ ...good, payload: [1] }, /payload/],
    [{ ...good, payload: 'text' }, /payload/],
    [{ ...good, payload: new Date(0) }, /payload/],
    [{ ...good, payload: { n: 1n } }, /JSON/],
    [{ ...good, payload: cycle }, /JSON/],
  ]) {
    assert.match(outboxProblem(bad) ?? '', why, JSON.stringify(bad, (_, v) => (typeof v === 'bigint' ? `${v}n` : v === cycle ? '[cycle]' : v)));
  }
  // Without serializing, only the shape is looked at (the push tries the whole batch at once).
  assert.equal(outboxProblem({ ...good, payload: { n: 1n } }, false), null);
  assert.match(outboxProblem({ ...good, type: 5 }, false) ?? '', /type/);
});

test('a live stream message is an event with an integer seq, or nothing', () => {
  assert.deepEqual(streamEvent('{"seq":3,"type":"note"}'), { seq: 3, type: 'note' });
  for (const bad of ['{"seq":3', '', 'null', '[]', '{"seq":"3"}', '{"seq":1.5}', '{}', '7']) {
    assert.equal(streamEvent(bad), null, bad);
  }
});

test('a stored cursor is a seq, or none', () => {
  assert.equal(storedSeq(0), 0);
  assert.equal(storedSeq(1e15), 1e15);
  for (const bad of [undefined, null, -1, 1.5, '12', NaN, Infinity, {}, 2 ** 53]) {
    assert.equal(storedSeq(bad), undefined, String(bad));
  }
});

test('SSE framing: what a message not ended yet holds is counted', () => {
  const parser = new SSEParser();
  assert.deepEqual(parser.push('data: abc\ndata: de\nxyz'), []);
  assert.equal(parser.pending, 3 + 2 + 3);
  assert.equal(parser.push('\n\n').length, 1);
  assert.equal(parser.pending, 0);
});

// MARK: - The export's end line

const ACCOUNT = '{"kind":"account","id":"a","email":"me@example.com","user_metadata":{}}';
const exportEvent = (seq) =>
  `{"kind":"event","id":"e${seq}","seq":${seq},"type":"note","payload":{"text":"a\\nb \\"}\\" {\\"kind\\":\\"end\\"}"}}`;
const exportEnd = (events, lastSeq) => `{"kind":"end","events":${events},"last_seq":${lastSeq}}`;
const exportBody = (lines) => new TextEncoder().encode(lines.map((line) => line + '\n').join(''));

/** The end line `body` says, pushed whole, byte by byte and in pieces of 7: the same outcome. */
function checkExport(body) {
  const outcomes = [body.length + 1, 1, 7].map((size) => {
    try {
      const check = new ExportCheck();
      for (let start = 0; start < body.length; start += size) check.push(body.slice(start, start + size));
      return { end: check.finish() };
    } catch (error) {
      return { error: `${error.code}: ${error.message}` };
    }
  });
  assert.deepEqual(outcomes[1], outcomes[0]);
  assert.deepEqual(outcomes[2], outcomes[0]);
  if (outcomes[0].error) throw new Error(outcomes[0].error);
  return outcomes[0].end;
}

function assertIncomplete(body, reason) {
  assert.throws(() => checkExport(body), (error) => {
    assert.ok(error.message.startsWith('incomplete_export: the export is incomplete: '), error.message);
    assert.ok(error.message.includes(reason), `${error.message} lacks ${reason}`);
    return true;
  });
}

test('a whole export is its end line: the count and last seq of the event lines before it', () => {
  const events = [1, 2, 3].map(exportEvent);
  assert.deepEqual(checkExport(exportBody([ACCOUNT, ...events, exportEnd(3, 3)])), { events: 3, last_seq: 3 });
  assert.deepEqual(checkExport(exportBody([ACCOUNT, exportEnd(0, 0)])), { events: 0, last_seq: 0 });
  const jumping = [ACCOUNT, exportEvent(2), exportEvent(1e15), exportEnd(2, 1e15)];
  assert.deepEqual(checkExport(exportBody(jumping)), { events: 2, last_seq: 1e15 });
});

test('an export without its end line, or cut inside a line, is incomplete_export', () => {
  const lines = [ACCOUNT, ...[1, 2, 3].map(exportEvent)];
  assertIncomplete(exportBody(lines), 'no end line: 3 event line(s) came');
  assertIncomplete(exportBody([ACCOUNT]), 'no end line: 0 event line(s)');
  assertIncomplete(new Uint8Array(0), 'empty');
  const whole = exportBody([...lines, exportEnd(3, 3)]);
  assertIncomplete(whole.slice(0, -30), 'stops in the middle of line 5');
  assertIncomplete(whole.slice(0, -1), 'stops in the middle of line 5');
  assertIncomplete(exportBody(lines).slice(0, -1), 'stops in the middle of line 4');
});

test('an end line that does not match what came is incomplete_export', () => {
  const events = [1, 2, 3].map(exportEvent);
  assertIncomplete(exportBody([ACCOUNT, ...events, exportEnd(4, 3)]), 'counts 4 event line(s), but 3 came');
  assertIncomplete(exportBody([ACCOUNT, ...events.slice(0, 2), exportEnd(3, 3)]), 'counts 3');
  assertIncomplete(exportBody([ACCOUNT, ...events, exportEnd(3, 2)]), 'last seq is 2, but it is 3');
  assertIncomplete(exportBody([ACCOUNT, exportEnd(0, 5)]), 'last seq is 5, but it is 0');
  for (const broken of [
    '{"kind":"end","events":3}', '{"kind":"end","events":"3","last_seq":3}', '{"kind":"end","events":3.5,"last_seq":3}',
    '{"kind":"end","events":-1,"last_seq":3}', '{"kind":"end","events":3,"last_seq":3} x',
  ]) {
    assertIncomplete(exportBody([ACCOUNT, ...events, broken]), 'end line cannot be read');
  }
});

test('anything after the end line, or out of place, is incomplete_export', () => {
  const whole = [ACCOUNT, exportEvent(1), exportEnd(1, 1)];
  const bytes = (text) => new TextEncoder().encode(text);
  const joined = (...parts) => new Uint8Array(parts.flatMap((part) => [...part]));
  assertIncomplete(exportBody([...whole, exportEvent(2)]), 'goes on after its end line');
  assertIncomplete(exportBody([...whole, exportEnd(1, 1)]), 'goes on after its end line');
  assertIncomplete(joined(exportBody(whole), bytes('\n')), 'goes on after its end line');
  assertIncomplete(joined(exportBody(whole), bytes('{')), 'goes on after its end line');
  assertIncomplete(exportBody([...whole, ...whole]), 'goes on after its end line');
  assertIncomplete(exportBody([exportEvent(1), exportEnd(1, 1)]), 'first line is not the account');
  assertIncomplete(exportBody([ACCOUNT, ACCOUNT, exportEnd(0, 0)]), 'line 2 is neither');
  assertIncomplete(exportBody([ACCOUNT, '<html>', exportEnd(0, 0)]), 'line 2 is neither');
});

test('event lines whose seqs do not increase are incomplete_export: a page missing, another repeated', () => {
  const lines = (seqs) => seqs.map(exportEvent);
  // Pages of two: [3, 4] missing, [5, 6] twice. The count and the last seq match the end line.
  assertIncomplete(exportBody([ACCOUNT, ...lines([1, 2, 5, 6, 5, 6]), exportEnd(6, 6)]), 'line 6 has seq 5 after 6');
  assertIncomplete(exportBody([ACCOUNT, ...lines([1, 2, 2, 3]), exportEnd(4, 3)]), 'line 4 has seq 2 after 2');
  assertIncomplete(exportBody([ACCOUNT, ...lines([0]), exportEnd(1, 0)]), 'line 2 has seq 0 after 0');
  assert.deepEqual(checkExport(exportBody([ACCOUNT, ...lines([1, 3, 7]), exportEnd(3, 7)])), { events: 3, last_seq: 7 });
});

test("an event line's seq is read from its first members; a line not as the server writes it, as JSON", () => {
  const line = (text) => new TextEncoder().encode(text);
  const seq = (text) => exportSeq(line(text), 'line 2');
  // Only what comes before the seq is looked at: the payload after it is not read.
  assert.equal(seq('{"kind":"event","id":"e1","seq":42,"payload":{not json'), 42);
  assert.equal(seq('{"kind":"event","seq":9007199254740991}'), 9007199254740991);
  assert.equal(seq('{"kind":"event","id":"a\\"seq\\":5","seq":3,"x":1}'), 3); // a quote escaped in the id
  // Otherwise the whole line, as JSON.
  assert.equal(seq('{"kind":"event", "seq": 7, "payload": {}}'), 7);
  assert.equal(seq('{"kind":"event","payload":{"seq":99},"seq":3}'), 3);
  assert.equal(seq('{"kind":"event","seq":1e3,"payload":{}}'), 1000);
  for (const broken of [
    '{"kind":"event","seq":"5"}', '{"kind":"event","seq":-5}', '{"kind":"event","seq":07}', '{"kind":"event","id":"e"}',
    '{"kind":"event","seq":12345678901234567}', '{"kind":"event","seq":5.5}', '{"kind":"event","seq":5 x',
  ]) {
    assert.throws(() => seq(broken), /incomplete_export|the event line \(line 2\) cannot be read/, broken);
  }
});

// MARK: - Records the browser cannot read

const idbError = (name, message = 'x') => new DOMException(message, name);

test('a read that failed for its record is told apart from one that failed for the database', () => {
  for (const name of ['NotReadableError', 'NotFoundError', 'UnknownError', 'DataError']) {
    assert.ok(unreadableValue(idbError(name)), name);
  }
  for (const error of [idbError('InvalidStateError'), idbError('AbortError'), idbError('QuotaExceededError'),
    new TypeError('x'), null, undefined, 'NotReadableError', { name: 'TransactionInactiveError' }]) {
    assert.equal(unreadableValue(error), false, String(error?.name ?? error));
  }
});

test("only a missing file's error says the value is gone for good: Chrome's others are likely transient", () => {
  // Chrome 130+: the file missing; Chrome 12x-129 said NotFoundError for it.
  assert.ok(valueLost(idbError('NotReadableError', 'Data lost due to missing file.')));
  assert.ok(valueLost(idbError('NotFoundError', 'Failed to read large IndexedDB value')));
  // "internal, likely transient, errors" (a file it could not read now), and older versions' every failure.
  for (const name of ['UnknownError', 'DataError', 'AbortError', 'InvalidStateError']) {
    assert.equal(valueLost(idbError(name, 'Failed to read large IndexedDB value')), false, name);
  }
  for (const error of [null, undefined, 'NotReadableError', new TypeError('x')]) assert.equal(valueLost(error), false);
});

test('records read one by one: those that fail twice for themselves are unreadable, the others kept in order', async () => {
  const reads = [];
  const flaky = new Set([3]);
  const read = async (key) => {
    reads.push(key);
    if (key === 2) throw idbError('NotReadableError', 'Data lost due to missing file');
    if (key === 4) throw idbError('UnknownError', 'Failed to read large IndexedDB value');
    if (flaky.delete(key)) throw idbError('UnknownError'); // once only
    if (key === 5) return undefined; // gone meanwhile
    return { n: key };
  };
  const { values, unreadable } = await readEach([1, 2, 3, 4, 5, 6], read);
  assert.deepEqual(values, [{ n: 1 }, { n: 3 }, { n: 6 }]);
  assert.deepEqual(unreadable.map(({ key, error }) => [key, error.name]), [[2, 'NotReadableError'], [4, 'UnknownError']]);
  // Each once, and again only those that failed.
  assert.deepEqual(reads.sort(), [1, 2, 2, 3, 3, 4, 4, 5, 6]);
  assert.deepEqual(await readEach([], read), { values: [], unreadable: [] });

  // A failure that is not the record's rejects with it: nothing is taken for unreadable.
  const closed = idbError('InvalidStateError', 'The database connection is closing.');
  await assert.rejects(readEach([1, 2, 7], async (key) => {
    if (key === 7) throw closed;
    return read(key);
  }), (error) => error === closed);
});

test('what is left of a record the browser cannot read: its key and the error, no event', () => {
  const error = idbError('NotReadableError', 'Data lost due to missing file.');
  const now = '2026-11-28T10:00:00.000Z';
  assert.deepEqual(unreadableEntry('outbox', 17, error, now), {
    client_id: 'unreadable-17', type: '', payload: {}, client_timestamp: '', field: 'unreadable',
    reason: 'the browser cannot read outbox record 17 (NotReadableError: Data lost due to missing file.): its content is lost',
    quarantined_at: now, outbox_key: 17,
  });
  assert.deepEqual(unreadableEntry('quarantine', 'c0ffee', error, now), {
    client_id: 'c0ffee', type: '', payload: {}, client_timestamp: '', field: 'unreadable',
    reason: 'the browser cannot read this quarantine entry (NotReadableError: Data lost due to missing file.): its content is lost',
    quarantined_at: '',
  });
  assert.match(unreadableEntry('outbox', 1, 'odd', now).reason, /\(odd\)/);
  // A quarantine entry that failed otherwise is still stored: it may read again, not to be discarded in haste.
  const transient = idbError('UnknownError', 'Failed to read large IndexedDB value');
  assert.match(unreadableEntry('quarantine', 'c0ffee', transient, now).reason, /\(UnknownError: .*\): it may be readable again later$/);
  // The outbox's is gone from there whatever the error.
  assert.match(unreadableEntry('outbox', 2, transient, now).reason, /its content is lost$/);
});

test('an answer is read up to the limit; past it, or announced past it, it is cancelled unread', async () => {
  /** A body of `pieces` (then done), or without end; `pulled` counts what was read of it. */
  const body = (/** @type {string[] | null} */ pieces) => {
    const state = { pulled: 0, cancelled: false };
    let index = 0;
    const stream = new ReadableStream({
      pull(controller) {
        state.pulled++;
        if (pieces && index >= pieces.length) controller.close();
        else controller.enqueue(new TextEncoder().encode(pieces ? pieces[index++] : 'x'.repeat(1000)));
      },
      cancel() {
        state.cancelled = true;
      },
    });
    return { stream, state };
  };
  const answer = (/** @type {ReadableStream | null} */ stream, length = null) => ({
    headers: { get: (/** @type {string} */ name) => (name === 'Content-Length' ? length : null) },
    body: stream,
  });

  const whole = body(['{"a":', '"h\u00e9"}']);
  assert.deepEqual(await readAnswer(answer(whole.stream), 100), { text: '{"a":"h\u00e9"}', cutOff: false });
  const exact = body(['12345', '67890']);
  assert.deepEqual(await readAnswer(answer(exact.stream), 10), { text: '1234567890', cutOff: false });
  assert.deepEqual(await readAnswer(answer(null), 10), { text: '', cutOff: false });

  const over = body(['12345', '678901']);
  assert.deepEqual(await readAnswer(answer(over.stream), 10), { text: '', cutOff: true });
  assert.ok(over.state.cancelled);

  // A body that never ends is read only up to the limit (a piece past it), then cancelled.
  const endless = body(null);
  assert.deepEqual(await readAnswer(answer(endless.stream), 64 * 1024), { text: '', cutOff: true });
  assert.ok(endless.state.cancelled);
  assert.ok(endless.state.pulled <= 64 + 2, `${endless.state.pulled} pieces read`);

  // Announced past the limit: nothing of it is read.
  const announced = body(null);
  assert.deepEqual(await readAnswer(answer(announced.stream, '1073741824'), 64 * 1024), { text: '', cutOff: true });
  assert.ok(announced.state.cancelled);
  assert.ok(announced.state.pulled <= 1, `${announced.state.pulled} pieces read`);
});
