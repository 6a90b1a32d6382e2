"""bench/web-client: the browser client in headless Chromium against a running server.

Usage: bench.py API_URL SESSIONS_FILE  (one `trunk-sync token` JSON per line, 2 per round)

Per round, each against a reference measured in the same tab, alternately:
  record: 10,000 `client.record` calls, one after the other (per-event latency with strict
          durability), against the same number of bare IndexedDB `add`s in strict
          transactions (what durability alone costs);
  sync:   `client.sync()` pushing those 10,000, then `client.sync(handler)` pulling them from
          cursor 0, against bare `fetch` pushes and pulls of 10,000 events in pages of 1000
          (what the server and the network alone cost).
Prints one JSON line per round and a summary.
"""
import http.server
import json
import os
import statistics
import sys
import threading

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service

API, SESSIONS = sys.argv[1], sys.argv[2]
COUNT = int(os.environ.get("BENCH_EVENTS", "10000"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "2"))
MODULE = os.path.join(os.path.dirname(__file__), "..", "..", "clients", "web", "trunk-sync.js")
PAGE = b"""<!doctype html><meta charset="utf-8"><script type="module">
import * as m from '/trunk-sync.js'; window.TrunkSync = m; window.ready = true;
</script>"""


class Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path.startswith("/trunk-sync.js"):
            body, kind = open(MODULE, "rb").read(), "text/javascript"
        else:
            body, kind = PAGE, "text/html"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


CLIENT = """
const [url, session, count] = args;
localStorage.setItem('trunk-sync|session|' + url, JSON.stringify({
  access_token: session.access_token, refresh_token: session.refresh_token, expires_in: session.expires_in,
  expires_at: Math.floor(Date.now() / 1000) + session.expires_in, user_id: session.user.id, email: session.user.email}));
const client = new TrunkSync.TrunkSyncClient({url, autoPush: false, live: false, maxBatchEvents: 1000});
const latencies = [];
for (let n = 0; n < count; n++) {
  const start = performance.now();
  await client.record('bench', {n, text: 'a note of some thirty bytes'});
  latencies.push(performance.now() - start);
}
let start = performance.now();
const pushed = await client.sync();
const push = performance.now() - start;
const db = await client.current().db();
await new Promise((resolve) => { const tx = db.transaction('meta', 'readwrite'); tx.objectStore('meta').put(0, 'cursor'); tx.oncomplete = resolve; });
let seen = 0;
start = performance.now();
const pulled = await client.sync((events) => { seen += events.length; });
const pull = performance.now() - start;
if (pushed.pushed !== count || seen !== count) throw new Error(`pushed ${pushed.pushed}, pulled ${seen}`);
client.close();
return {latencies, push, pull};
"""

REFERENCE = """
const [url, session, count] = args;
const db = await new Promise((resolve, reject) => {
  const request = indexedDB.open('bench-reference-' + Math.random(), 1);
  request.onupgradeneeded = () => request.result.createObjectStore('outbox', {keyPath: 'n', autoIncrement: true});
  request.onsuccess = () => resolve(request.result); request.onerror = () => reject(request.error);
});
const latencies = [];
for (let n = 0; n < count; n++) {
  const start = performance.now();
  await new Promise((resolve, reject) => {
    const tx = db.transaction('outbox', 'readwrite', {durability: 'strict'});
    tx.objectStore('outbox').add({client_id: crypto.randomUUID(), type: 'bench', payload: {n, text: 'a note of some thirty bytes'},
      client_timestamp: new Date().toISOString()});
    tx.oncomplete = resolve; tx.onerror = () => reject(tx.error);
  });
  latencies.push(performance.now() - start);
}
const headers = {Authorization: 'Bearer ' + session.access_token, 'Content-Type': 'application/json'};
let start = performance.now();
for (let page = 0; page < count / 1000; page++) {
  const events = Array.from({length: 1000}, (_, i) => ({client_id: crypto.randomUUID(), type: 'bench',
    payload: {n: page * 1000 + i, text: 'a note of some thirty bytes'}, client_timestamp: new Date().toISOString()}));
  const response = await fetch(url + '/sync/v1/events', {method: 'POST', headers, body: JSON.stringify({events})});
  if (!response.ok) throw new Error('push ' + response.status);
  await response.json();
}
const push = performance.now() - start;
start = performance.now();
let after = 0, seen = 0;
for (;;) {
  const response = await fetch(`${url}/sync/v1/events?after=${after}&limit=1000`, {headers});
  const body = await response.json();
  seen += body.events.length; after = body.next_after;
  if (!body.has_more) break;
}
const pull = performance.now() - start;
if (seen !== count) throw new Error('pulled ' + seen);
db.close();
return {latencies, push, pull};
"""


def run(driver, body, *args):
    script = ("const done = arguments[arguments.length - 1]; const args = Array.from(arguments).slice(0, -1);"
              f"(async (args) => {{ {body} }})(args).then((v) => done({{value: v}}), (e) => done({{error: String(e.stack || e)}}));")
    result = driver.execute_async_script(script, *args)
    if "error" in result:
        raise SystemExit(result["error"])
    return result["value"]


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def main():
    sessions = [json.loads(line) for line in open(SESSIONS) if line.strip()]
    page = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=page.serve_forever, daemon=True).start()
    options = Options()
    options.binary_location = "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    driver.set_script_timeout(1800)
    results = {"client": [], "reference": []}
    try:
        driver.get(f"http://127.0.0.1:{page.server_address[1]}/")
        for round_ in range(ROUNDS):
            order = ["client", "reference"] if round_ % 2 == 0 else ["reference", "client"]
            for kind in order:
                session = sessions.pop(0)
                value = run(driver, CLIENT if kind == "client" else REFERENCE, API, session, COUNT)
                figures = {"round": round_ + 1, "kind": kind, "record_p50_ms": round(percentile(value["latencies"], 50), 3),
                           "record_p99_ms": round(percentile(value["latencies"], 99), 3),
                           "record_total_s": round(sum(value["latencies"]) / 1000, 2),
                           "push_s": round(value["push"] / 1000, 3), "pull_s": round(value["pull"] / 1000, 3)}
                results[kind].append(figures)
                print(json.dumps(figures), flush=True)
    finally:
        driver.quit()
        page.shutdown()
    print(f"== {COUNT} events, {ROUNDS} rounds (mean; min–max)")
    for name in ("record_p50_ms", "record_p99_ms", "push_s", "pull_s"):
        client = [r[name] for r in results["client"]]
        reference = [r[name] for r in results["reference"]]
        ratio = statistics.mean(client) / statistics.mean(reference) if statistics.mean(reference) else float("nan")
        print(f"{name:14} client {statistics.mean(client):8.3f} ({min(client)}–{max(client)})"
              f"   reference {statistics.mean(reference):8.3f} ({min(reference)}–{max(reference)})   ratio {ratio:.2f}")
    p99 = statistics.mean(r["record_p99_ms"] for r in results["client"])
    push = max(r["push_s"] for r in results["client"])
    pull = max(r["pull_s"] for r in results["client"])
    print(f"goals: record p99 {p99:.2f} ms (≤ 10: {'met' if p99 <= 10 else 'MISSED'}), "
          f"push {push:.2f} s and pull {pull:.2f} s of {COUNT} (≤ 5 s: {'met' if max(push, pull) <= 5 else 'MISSED'})")


main()
