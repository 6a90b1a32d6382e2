"""The browser client (clients/web/trunk-sync.js) in headless Chromium against the real server.

Usage: web_client.py API_URL PAGE_PORT SMTP_SINK_DIR

Serves a page on http://127.0.0.1:PAGE_PORT (another origin than API_URL) that imports the
module, and drives it through selenium (Debian's chromium and chromium-driver). The pages
talk to the server through small HTTP proxies run here, which can hold push answers back,
answer a request with a 429/503/401 instead of the server, and cut every open stream. Mails
(sign-in codes) come from the SMTP sink's directory. Prints `ok <step>` per step that held;
exits non-zero at the first that did not.
"""
import glob
import http.client
import http.server
import json
import os
import re
import shutil
import socket
import sys
import tempfile
import threading
import time
import urllib.request
import uuid

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.common.by import By

API, PAGE_PORT, SINK = sys.argv[1], int(sys.argv[2]), sys.argv[3]
API_PORT = int(API.rsplit(":", 1)[1])
MODULE = os.path.join(os.path.dirname(__file__), "..", "..", "clients", "web", "trunk-sync.js")
EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "web", "index.html")
GUIDE = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "web-client.md")
PAGE_ORIGIN = f"http://127.0.0.1:{PAGE_PORT}"
TIMEOUT = 90  # generous: the machine is shared
RUN = os.urandom(3).hex()  # addresses of this run: the per-address limits start afresh
ALICE, CAROL = f"alice-{RUN}@example.com", f"carol-{RUN}@example.com"


def element_shows(driver, selector, text=None):
    """The element is displayed (and holds `text`); False while the page is (re)loading."""
    try:
        element = driver.find_element(By.CSS_SELECTOR, selector)
        return element.is_displayed() and (text is None or text in element.text)
    except WebDriverException:
        return False


def submit(driver, form, text):
    """Types `text` into the form's input and presses its button, as a person does."""
    driver.find_element(By.CSS_SELECTOR, f"{form} input").send_keys(text)
    driver.find_element(By.CSS_SELECTOR, f"{form} button").click()


def sign_in_on_page(driver, url, email_form, code_form, address):
    """Opens `url` and signs in through its two forms, as a person does, with the mailed code."""
    driver.get(url)
    wait_until(lambda: element_shows(driver, email_form), f"the sign-in form of {url}")
    count = len(mails_to(address)) + 1
    submit(driver, email_form, address)
    submit(driver, code_form, code_for(address, count))


def step(name):
    print(f"ok {name}", flush=True)


def wait_until(condition, what, timeout=TIMEOUT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


# MARK: - Mail and the API, directly


def mails_to(address):
    bodies = []
    for path in sorted(glob.glob(os.path.join(SINK, "*.json")), key=lambda p: int(os.path.basename(p)[:-5])):
        with open(path, encoding="utf-8") as file:
            record = json.load(file)
        if address in record.get("rcpt_tos", []):
            bodies.append(record["parsed"]["body"])
    return bodies


def code_for(address, count):
    bodies = wait_until(lambda: len(mails_to(address)) >= count and mails_to(address), f"mail {count} to {address}")
    return re.search(r"\b(\d{6})\b", bodies[count - 1]).group(1)


def api(method, path, body=None, token=None):
    request = urllib.request.Request(API + path, method=method, data=None if body is None else json.dumps(body).encode())
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read().decode()
        return json.loads(text) if text else None


def api_session(address):
    """A session of our own for `address` (the server's answer to /verify)."""
    count = len(mails_to(address)) + 1
    wait_until(lambda: try_otp(address), f"a code for {address}")
    return api("POST", "/auth/v1/verify", {"email": address, "token": code_for(address, count), "type": "email"})


def api_token(address):
    """An access token of our own for `address`, to look at what the server stored."""
    return api_session(address)["access_token"]


def push(token, text):
    """Pushes a note as another device does; its seq."""
    event = {"client_id": str(uuid.uuid4()), "type": "note", "payload": {"text": text},
             "client_timestamp": "2026-11-27T12:00:00.000Z"}
    return api("POST", "/sync/v1/events", {"events": [event]}, token)["results"][0]["seq"]


def try_otp(address):
    try:
        api("POST", "/auth/v1/otp", {"email": address})
        return True
    except urllib.error.HTTPError as error:
        if error.code == 429:  # the resend interval (1 s in the test server)
            time.sleep(float(error.headers.get("Retry-After") or 1))
            return False
        raise


def server_events(token):
    events, after = [], 0
    while True:
        page = api("GET", f"/sync/v1/events?after={after}&limit=1000", token=token)
        events += page["events"]
        after = page["next_after"]
        if not page["has_more"]:
            return events


def tagged(events, tag):
    return [event for event in events if event["payload"].get("tag") == tag]


def exactly_once(events, tag, count):
    numbers = sorted(event["payload"]["n"] for event in tagged(events, tag))
    assert numbers == list(range(count)), f"{tag}: {len(numbers)} events, want each of 0..{count - 1} once"
    ids = [event["client_id"] for event in tagged(events, tag)]
    assert len(set(ids)) == len(ids)


class QuietServer(http.server.ThreadingHTTPServer):
    """A browser closing a connection mid-answer (a crashed tab, a cut stream) is expected."""

    daemon_threads = True

    def handle_error(self, request, client_address):
        pass


# MARK: - A proxy between the pages and the server


class Proxy:
    """HTTP forwarding with faults: `rules` answer matching requests instead of the server
    (each used once; a body of "" is empty, one of bytes is sent as it is, e.g. PAGE_IN_THE_WAY), `push_delay` holds push answers back after the
    server committed, `hold()` keeps the next matching request until released, before
    anything else happens to it, `hold_answer()` the server's answer to it, `mangle()` replaces the server's answer to it with a
    200 page (an answer mangled on the way, after the server acted), `paused` closes every request unanswered, `cut()` ends the
    open event streams, `fake_stream` answers stream requests itself: "silent" (a 200 event
    stream that never sends a byte, as a dead connection), "empty" (one that ends at once),
    "json" (a 200 that is not an event stream), "401" (the token refused), "401-page" (a
    proxy's HTML 401, not the server's) or, once, "endless"
    (a 200 event stream whose one line never ends: 3 MiB at once, then a byte every 0.2 s),
    `stall_export` answers the export with its head and a piece of body, then nothing,
    `rewrite_export` (a function of the body) changes the server's export and sends it as a
    proxy that lost the HTTP framing does: no length, ended by closing the connection,
    `poison_stream` ends the next piece of the open event streams that holds a whole event
    with a message that is not one (cut short on the way) and closes them, and
    `max_push_bytes` refuses a larger push body with nginx's 413 (client_max_body_size),
    `answer_huge()` answers the next matching request with a 200 of 64 MiB of blanks (chunked,
    or announced by its Content-Length), `huge_outcome` saying whether it went out "whole" or
    was "cut" (the page closed the connection first).
    `pulled` and `streamed` count the events its pull answers and event streams carried."""

    def __init__(self):
        self.rules, self.log, self.streams, self.holds, self.answer_holds = [], [], set(), {}, {}
        self.mangled = set()
        self.push_delay, self.paused, self.fake_stream, self.stall_export = 0.0, False, None, False
        self.rewrite_export = None
        self.poison_stream = False
        self.max_push_bytes = None
        self.huge, self.huge_outcome = None, None
        self.pulled, self.streamed = 0, 0
        self.lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def forward(self):
                try:
                    proxy.handle(self)
                except (OSError, http.client.HTTPException):  # the page went away
                    self.close_connection = True

            do_GET = do_POST = do_PUT = do_DELETE = do_OPTIONS = do_HEAD = forward

        self.server = QuietServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add_rule(self, method, path, status, headers=None, body=None, skip=0):
        """Answers the matching request after the next `skip` ones with `status`, once."""
        with self.lock:
            body = {"code": "injected", "message": "x"} if body is None else body
            self.rules.append([method, path, status, headers or {}, body, skip])

    def hold(self, method, path):
        """Holds the next `method path` request: returns (arrived, release), two Events; the
        request goes on (to the rules, then the server) once `release` is set."""
        arrived, release = threading.Event(), threading.Event()
        with self.lock:
            self.holds[(method, path)] = (arrived, release)
        return arrived, release

    def hold_answer(self, method, path):
        """Holds the server's answer to the next `method path` request, as `hold` does the
        request: (answered, release)."""
        answered, release = threading.Event(), threading.Event()
        with self.lock:
            self.answer_holds[(method, path)] = (answered, release)
        return answered, release

    def mangle(self, method, path):
        """Answers the next `method path` request, once the server answered it, with a 200 page
        instead of the server's answer."""
        with self.lock:
            self.mangled.add((method, path))

    def answer_huge(self, method, path, announced):
        with self.lock:
            self.huge, self.huge_outcome = (method, path, announced), None

    def requests(self, method, path):
        with self.lock:
            return [entry for entry in self.log if entry[1] == method and entry[2] == path]

    def cut(self):
        with self.lock:
            streams = list(self.streams)
        for client, upstream in streams:
            for sock in (client, upstream):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def handle(self, handler):
        method, path = handler.command, handler.path.split("?")[0]
        if self.paused:
            handler.close_connection = True
            handler.connection.shutdown(socket.SHUT_RDWR)
            return
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else None
        with self.lock:
            hold = self.holds.pop((method, path), None)
        if hold:
            hold[0].set()
            hold[1].wait(TIMEOUT)
        delay = self.push_delay if method == "POST" and path == "/sync/v1/events" else 0
        if method == "GET" and path == "/sync/v1/stream" and self.fake_stream:
            kind = self.fake_stream
            if kind == "endless":
                self.fake_stream = None
            self.answer_stream(handler, kind)
            return
        if method == "GET" and path == "/sync/v1/export" and self.stall_export:
            self.answer_stalled_export(handler)
            return
        with self.lock:
            huge = self.huge if self.huge and self.huge[:2] == (method, path) else None
            if huge:
                self.huge = None
        if huge:
            self.answer_huge_now(handler, huge[2])
            return
        if method == "POST" and path == "/sync/v1/events" and self.max_push_bytes and length > self.max_push_bytes:
            self.answer_too_large(handler)
            return
        with self.lock:
            rule = next((r for r in self.rules if r[0] == method and r[1] == path), None)
            if rule and rule[5] > 0:
                rule[5] -= 1
                rule = None
            elif rule:
                self.rules.remove(rule)
        if rule:
            payload = rule[4] if isinstance(rule[4], bytes) else b"" if rule[4] == "" else json.dumps(rule[4]).encode()
            if "Date" in rule[3]:
                handler.send_response_only(rule[2])  # the rule's Date, not the proxy's as well
            else:
                handler.send_response(rule[2])
            for name, value in {
                "Content-Type": "application/json", "Content-Length": str(len(payload)),
                "Access-Control-Allow-Origin": handler.headers.get("Origin", "*"),
                "Access-Control-Expose-Headers": "Retry-After", **rule[3],
            }.items():
                handler.send_header(name, value)
            handler.end_headers()
            handler.wfile.write(payload)
            with self.lock:
                self.log.append((time.monotonic(), method, path, rule[2]))
            return
        upstream = http.client.HTTPConnection("127.0.0.1", API_PORT, timeout=300)
        headers = {k: v for k, v in handler.headers.items()
                   if k.lower() not in ("host", "connection", "content-length", "keep-alive", "transfer-encoding")}
        upstream.request(method, handler.path, body=body, headers=headers)
        response = upstream.getresponse()
        with self.lock:
            self.log.append((time.monotonic(), method, path, response.status))
            hold = self.answer_holds.pop((method, path), None)
        if hold:
            hold[0].set()
            hold[1].wait(TIMEOUT)
        with self.lock:
            mangled = (method, path) in self.mangled
            self.mangled.discard((method, path))
        if mangled:
            response.read()
            upstream.close()
            headers, page = PAGE_IN_THE_WAY
            handler.send_response(200)
            for name, value in {**headers, "Content-Length": str(len(page)),
                                "Access-Control-Allow-Origin": handler.headers.get("Origin", "*")}.items():
                handler.send_header(name, value)
            handler.end_headers()
            handler.wfile.write(page)
            return
        if delay:
            time.sleep(delay)
        streaming = (response.getheader("Content-Type") or "").startswith("text/event-stream")
        handler.send_response_only(response.status)
        for name, value in response.getheaders():
            if name.lower() not in ("connection", "content-length", "keep-alive", "transfer-encoding"):
                handler.send_header(name, value)
        if not streaming:
            data = response.read()
            if method == "GET" and path == "/sync/v1/events" and response.status == 200:
                with self.lock:
                    self.pulled += len(json.loads(data)["events"])
            rewrite = self.rewrite_export if method == "GET" and path == "/sync/v1/export" else None
            if rewrite:  # close-delimited: the body's end is the connection's
                self.rewrite_export = None
                handler.send_header("Connection", "close")
                handler.end_headers()
                handler.wfile.write(rewrite(data))
                handler.close_connection = True
                upstream.close()
                return
            handler.send_header("Content-Length", str(len(data)))
            handler.end_headers()
            handler.wfile.write(data)
            upstream.close()
            return
        handler.send_header("Connection", "close")
        handler.end_headers()
        handler.close_connection = True
        entry = (handler.connection, upstream.sock)
        with self.lock:
            self.streams.add(entry)
        marker, tail = b"\nevent: event\n", b""
        try:
            while True:
                chunk = response.read1(65536)
                if not chunk:
                    break
                # Each event's message, also one cut between two chunks.
                seen = tail + chunk
                with self.lock:
                    self.streamed += seen.count(marker)
                tail = seen[-(len(marker) - 1):]
                if self.poison_stream and marker in seen and chunk.endswith(b"\n\n"):
                    # In the same write as the event: the page reads both in one piece.
                    self.poison_stream = False
                    handler.wfile.write(chunk + b'event: event\ndata: {"seq": \n\n')
                    handler.wfile.flush()
                    break
                handler.wfile.write(chunk)
                handler.wfile.flush()
        except (OSError, http.client.HTTPException):
            pass
        finally:
            with self.lock:
                self.streams.discard(entry)
            upstream.close()


    def answer_stream(self, handler, kind):
        status = 401 if kind in ("401", "401-page") else 200
        body = (b'{"code":"invalid_token","message":"refused"}' if kind == "401"
                else PAGE_IN_THE_WAY[1] if kind == "401-page" else b"")
        handler.send_response(status)
        handler.send_header("Content-Type", "text/html" if kind == "401-page"
                            else "application/json" if kind in ("json", "401") else "text/event-stream")
        handler.send_header("Access-Control-Allow-Origin", handler.headers.get("Origin", "*"))
        handler.send_header("Connection", "close")
        if kind not in ("silent", "endless"):
            handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)
        handler.wfile.flush()
        handler.close_connection = True
        with self.lock:
            self.log.append((time.monotonic(), "GET", "/sync/v1/stream", status))
        if kind == "silent":  # open until the page gives up on it
            self.wait_for_close(handler)
        if kind == "endless":  # until the page gives up on it, or two minutes
            try:
                handler.wfile.write(b"data: " + b"x" * (3 * 1024 * 1024))
                handler.wfile.flush()
                for _ in range(600):
                    time.sleep(0.2)
                    handler.wfile.write(b"x")
                    handler.wfile.flush()
            except OSError:
                pass

    def answer_huge_now(self, handler, announced):
        """A 200 of 64 MiB of blanks (a proxy gone wrong), or as much as the page reads of it."""
        total, piece = 64 * 1024 * 1024, b" " * 65536
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Access-Control-Allow-Origin", handler.headers.get("Origin", "*"))
        handler.send_header("Content-Length" if announced else "Transfer-Encoding",
                            str(total) if announced else "chunked")
        handler.send_header("Connection", "close")
        handler.end_headers()
        handler.close_connection = True
        with self.lock:
            self.log.append((time.monotonic(), handler.command, handler.path.split("?")[0], 200))
        outcome = "whole"
        try:
            for _ in range(total // len(piece)):
                time.sleep(0.001)  # at most ~64 MB/s: a network's pace, not the loopback's
                handler.wfile.write(piece if announced else b"%x\r\n%s\r\n" % (len(piece), piece))
            if not announced:
                handler.wfile.write(b"0\r\n\r\n")
            handler.wfile.flush()
        except OSError:
            outcome = "cut"
        with self.lock:
            self.huge_outcome = outcome

    def answer_too_large(self, handler):
        """nginx's answer to a body over its client_max_body_size (HTML, not the API's JSON)."""
        body = b"<html><head><title>413 Request Entity Too Large</title></head></html>\n"
        handler.send_response(413)
        handler.send_header("Content-Type", "text/html")
        handler.send_header("Content-Length", str(len(body)))
        handler.send_header("Access-Control-Allow-Origin", handler.headers.get("Origin", "*"))
        handler.end_headers()
        handler.wfile.write(body)
        with self.lock:
            self.log.append((time.monotonic(), "POST", "/sync/v1/events", 413))

    def answer_stalled_export(self, handler):
        """A 200 export whose body stops after its first piece (a connection gone dead)."""
        handler.send_response(200)
        handler.send_header("Content-Type", "application/x-ndjson")
        handler.send_header("Content-Length", "100000")
        handler.send_header("Access-Control-Allow-Origin", handler.headers.get("Origin", "*"))
        handler.send_header("Connection", "close")
        handler.end_headers()
        handler.wfile.write(b'{"kind":"account","id":"00000000-0000-4000-8000-000000000000"}\n')
        handler.wfile.flush()
        handler.close_connection = True
        with self.lock:
            self.log.append((time.monotonic(), "GET", "/sync/v1/export", 200))
        self.wait_for_close(handler)

    @staticmethod
    def wait_for_close(handler):
        try:
            while handler.connection.recv(4096):
                pass
        except OSError:
            pass


# A page of something between the browser and the server (a proxy set up wrong, a captive
# portal), as a rule's headers and body: not the server's JSON error.
PAGE_IN_THE_WAY = ({"Content-Type": "text/html"}, b"<html><body><h1>Something went wrong</h1></body></html>\n")


# MARK: - The page


PAGE = """<!doctype html>
<meta charset="utf-8">
<title>trunk-sync web client test</title>
<script type="module">
  import * as module from '/trunk-sync.js';
  window.TrunkSync = module;
  window.ready = true;
</script>
"""


class Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path.startswith("/trunk-sync.js"):
            with open(MODULE, "rb") as file:
                body, kind = file.read(), "text/javascript; charset=utf-8"
        elif self.path.startswith("/example/"):
            with open(EXAMPLE, "rb") as file:
                body, kind = file.read(), "text/html; charset=utf-8"
        elif self.path.startswith("/guide/"):
            # docs/web-client.md's complete page as written, with the server's address.
            with open(GUIDE, encoding="utf-8") as file:
                html = re.search(r"## A complete page\n\n```html\n(.*?)```", file.read(), re.S).group(1)
            body, kind = html.replace("http://127.0.0.1:8080", API).encode(), "text/html; charset=utf-8"
        else:
            body, kind = PAGE.encode(), "text/html; charset=utf-8"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def browser(profile=None):
    """Headless Chromium; on the profile directory `profile` when given (else a new one)."""
    options = Options()
    options.binary_location = "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    if profile:
        options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    driver.set_script_timeout(TIMEOUT)
    return driver


def js(driver, body, *args):
    """Runs `body` as an async function in the page (its arguments as `args`); returns its
    value or raises with the page's error."""
    script = (
        "const done = arguments[arguments.length - 1];"
        "const args = Array.from(arguments).slice(0, -1);"
        f"(async (args) => {{ {body} }})(args).then((value) => done({{value: value === undefined ? null : value}}),"
        " (error) => done({error: String(error && (error.code ? error.code + ': ' : '') + (error.stack || error))}));"
    )
    result = driver.execute_async_script(script, *args)
    if "error" in result:
        raise AssertionError(f"page: {result['error']}")
    return result["value"]


def open_page(driver, url, options=None):
    driver.get(f"{PAGE_ORIGIN}/")
    wait_until(lambda: driver.execute_script("return window.ready === true"), "the module")
    js(driver, "window.client = new TrunkSync.TrunkSyncClient({url: args[0], ...args[1]});"
       "window.live = []; window.recorded = [];", url, options or {})


def new_tab(driver, url, options=None):
    """Opens the page in a new tab of `driver`'s profile; the driver stays there. Its handle."""
    driver.switch_to.new_window("tab")
    handle = driver.current_window_handle
    open_page(driver, url, options)
    return handle


def sign_in(driver, address):
    count = len(mails_to(address)) + 1
    wait_until(lambda: js(driver, "try { await client.sendCode(args[0]); return true } catch (e) {"
                                  " if (e.status === 429) { await new Promise(r => setTimeout(r, (e.retryAfter || 1000))); return false }"
                                  " throw e }", address), f"a code for {address}")
    js(driver, "await client.verify(args[0], args[1]);", address, code_for(address, count))
    assert js(driver, "return client.isSignedIn")


def stream_tries(proxy, kind):
    """The stream requests `proxy` gets while it answers them with `kind` (see Proxy), from
    its open streams cut until 3 s after the first such answer: a window to count reconnects
    in (a hot loop makes hundreds)."""
    opened = len(proxy.requests("GET", "/sync/v1/stream"))
    proxy.fake_stream = kind
    proxy.cut()
    wait_until(lambda: len(proxy.requests("GET", "/sync/v1/stream")) > opened, f"a {kind} stream answer")
    time.sleep(3)
    proxy.fake_stream = None
    return len(proxy.requests("GET", "/sync/v1/stream")) - opened


def stored_session(driver):
    """The session the current tab's client stored."""
    return js(driver, "return JSON.parse(localStorage.getItem('trunk-sync|session|' + client.url))")


def failed_status(call):
    """The HTTP status `call` (an `api` call) failed with; raises if it succeeded."""
    try:
        call()
    except urllib.error.HTTPError as error:
        return error.code
    raise AssertionError("accepted")


# The stored session's access token as if it had expired, in this tab.
EXPIRE = ("const key = 'trunk-sync|session|' + client.url;"
          "const s = JSON.parse(localStorage.getItem(key)); s.expires_at = 0;"
          "localStorage.setItem(key, JSON.stringify(s)); client.session = s;")

# The current tab's stored sync cursor (undefined before a first pull).
CURSOR = ("const db = await client.current().db(); const r = db.transaction('meta')"
          ".objectStore('meta').get('cursor'); return await new Promise((resolve) => {"
          " r.onsuccess = () => resolve(r.result) })")

# What a sync (push, then pull) in the current tab ends with: 'synced' or the error's code.
SYNC_OUTCOME = "try { await client.sync(() => {}); return 'synced' } catch (e) { return e.code || String(e) }"

RECORD = """
const [tag, count] = args;
for (let n = 0; n < count; n++) window.recorded.push(await client.record('note', {tag, n}));
return count;
"""


def main():
    page = QuietServer(("127.0.0.1", PAGE_PORT), Page)
    threading.Thread(target=page.serve_forever, daemon=True).start()
    proxy, proxy2 = Proxy(), Proxy()
    first = browser()
    second = None
    try:
        # The served copy imports from the server's own origin (CORS as the API).
        first.get(f"{PAGE_ORIGIN}/")
        wait_until(lambda: first.execute_script("return window.ready === true"), "the module")
        served = js(first, "const m = await import(args[0] + '/client/v1/trunk-sync.js');"
                           "return typeof m.TrunkSyncClient === 'function'", API)
        assert served
        step("the served module imports from another origin")

        alice = api_token(ALICE)

        # Offline: record works and keeps the events; back online, sync sends them.
        open_page(first, proxy.url, {"retry": {"maxAttempts": 2, "baseDelay": 50}})
        sign_in(first, ALICE)
        offline(first, True)
        assert js(first, RECORD, "offline", 20) == 20
        assert js(first, "return await client.pendingCount()") == 20
        assert tagged(server_events(alice), "offline") == []
        offline(first, False)
        report = js(first, "const seen = []; const r = await client.sync((events) => { seen.push(...events) });"
                           "return {...r, seen: seen.filter(e => e.payload.tag === 'offline').length,"
                           " pending: await client.pendingCount()}")
        assert report["seen"] == 20 and report["pending"] == 0, report
        exactly_once(server_events(alice), "offline", 20)
        step("recorded offline, then synced: each event once on the server")

        # A tab killed while its pushes are in flight (the server committed, the answer is
        # held back by the proxy): reopened, it sends the rest and nothing twice.
        open_page(first, proxy.url, {"maxBatchEvents": 50, "autoPush": False})
        proxy.push_delay = 0.5
        assert js(first, RECORD, "crash", 600) == 600
        js(first, "window.syncing = client.sync().catch(() => {}); return true")
        wait_until(lambda: len(tagged(server_events(alice), "crash")) >= 50, "a first batch on the server")
        crash(first)
        stored = len(tagged(server_events(alice), "crash"))
        proxy.push_delay = 0
        open_page(first, proxy.url, {"maxBatchEvents": 50, "autoPush": False})
        report = js(first, "const r = await client.sync(); return {...r, pending: await client.pendingCount()}")
        assert report["pending"] == 0 and report["pushed"] + report["duplicates"] >= 600 - stored, report
        exactly_once(server_events(alice), "crash", 600)
        assert stored < 600, "the tab was not killed mid-push"
        step(f"tab killed mid-push ({stored} of 600 stored, {report['duplicates']} answered as duplicates):"
             " each event once")

        # Two tabs record at once; the leader is killed; the other takes over.
        open_page(first, proxy.url, {"maxBatchEvents": 20})
        leader = first.current_window_handle
        assert wait_until(lambda: js(first, "return client.isLeader"), "a leader")
        other = new_tab(first, proxy.url, {"maxBatchEvents": 20})
        assert not js(first, "return client.isLeader")
        first.execute_script("window.recording = (async () => { for (let n = 0; n < 300; n++)"
                             " window.recorded.push(await client.record('note', {tag: 'tabs-b', n})) })()")
        first.switch_to.window(leader)
        proxy.push_delay = 0.2
        assert js(first, RECORD, "tabs-a", 300) == 300
        wait_until(lambda: len(proxy.requests("POST", "/sync/v1/events")) > 0, "the leader pushing")
        crash(first)
        first.switch_to.window(other)
        started = time.monotonic()
        wait_until(lambda: js(first, "return client.isLeader"), "the other tab to take over")
        took = time.monotonic() - started
        proxy.push_delay = 0
        js(first, "await window.recording; return true")
        js(first, "await client.sync(); return true")
        events = server_events(alice)
        exactly_once(events, "tabs-a", 300)
        exactly_once(events, "tabs-b", 300)
        step(f"leader tab killed, the other took over (after {took:.2f} s): nothing lost or doubled")

        # A second browser profile (another device) gets the events live over the stream,
        # and after its connection is cut resumes with none missed.
        # Its first sign-in, as the guide's page does it (sync, open the iterator, sync, read),
        # with a history of many pages: each event comes down once, by the pull; the stream
        # opens after the pull's cursor and carries only what commits from then on.
        second = browser()
        open_page(second, proxy2.url, {"pageSize": 250})
        sign_in(second, ALICE)
        total = len(server_events(alice))
        first_sync = ("window.pulled = []; const pull = (events) => { window.pulled.push(...events.map(e => e.seq)) };"
                      "await client.sync(pull);"
                      "(async () => { for await (const e of client.liveEvents()) window.live.push(e.seq) })();"
                      "await client.sync(pull); return window.pulled")
        pulled = js(second, first_sync)
        assert pulled == list(range(1, total + 1)), (len(pulled), total)
        assert js(second, "return client.isLeader")
        leader_tab = second.current_window_handle
        follower_tab = new_tab(second, proxy2.url)  # another tab of that profile gets them from the leader
        assert not js(second, "return client.isLeader")
        js(second, "(async () => { for await (const e of client.liveEvents()) window.live.push(e.seq) })(); return true")
        second.switch_to.window(leader_tab)
        assert js(first, RECORD, "live-1", 5) == 5
        js(first, "await client.sync(); return true")
        wait_until(lambda: len(second.execute_script("return window.live")) >= 5, "live events")
        proxy2.paused = True
        proxy2.cut()
        assert js(first, RECORD, "live-2", 5) == 5
        js(first, "await client.sync(); return true")
        proxy2.paused = False
        wait_until(lambda: len(second.execute_script("return window.live")) >= 10, "events after the cut")
        live = second.execute_script("return window.live")
        assert live == list(range(total + 1, total + 11)), f"live seqs {live[:5]}…{live[-12:]}"
        assert (proxy2.pulled, proxy2.streamed) == (total, 10), \
            f"downloaded {proxy2.pulled} events by pull and {proxy2.streamed} by stream, want {total} and 10"
        second.switch_to.window(follower_tab)
        wait_until(lambda: len(second.execute_script("return window.live")) >= 10, "events in the other tab")
        assert second.execute_script("return window.live") == list(range(total + 1, total + 11))
        assert len(proxy2.requests("GET", "/sync/v1/stream")) >= 2, "the stream was not reopened"
        step(f"a first sign-in downloaded the history of {total} events once, by the pull"
             f" ({-(-total // 250)} pages), and only new events live")
        step("a second profile got every event live, none missed after a cut connection")

        # A stream gone silent (no keep-alive: a dead connection) is dropped and reopened.
        second.switch_to.window(leader_tab)
        js(second, "client.streamIdleTimeout = 3000; client.retry.maxDelay = 2000; return true")  # heartbeat: 1 s
        opened = len(proxy2.requests("GET", "/sync/v1/stream"))
        proxy2.fake_stream = "silent"
        proxy2.cut()
        wait_until(lambda: len(proxy2.requests("GET", "/sync/v1/stream")) > opened, "a silent stream")
        proxy2.fake_stream = None
        assert js(first, RECORD, "live-3", 3) == 3
        js(first, "await client.sync(); return true")
        wait_until(lambda: len(second.execute_script("return window.live")) >= 13, "events after the silence")
        assert second.execute_script("return window.live") == list(range(total + 1, total + 14))
        step("a stream gone silent was dropped and reopened, none missed")

        # A 200 that ends at once, or is not an event stream: reconnects back off.
        for kind in ("empty", "json"):
            reconnects = stream_tries(proxy2, kind)
            assert reconnects <= 15, f"{reconnects} stream requests in 3 s after {kind} answers"
        assert js(first, RECORD, "live-4", 2) == 2
        js(first, "await client.sync(); return true")
        wait_until(lambda: len(second.execute_script("return window.live")) >= 15, "events after the backoff")
        step("a stream that ends at once or is not an event stream is retried with backoff")

        # A stream refused with 401 although every refresh succeeds (a server that refuses
        # fresh tokens): after the first refresh, reconnects back off too.
        refreshes = len(proxy2.requests("POST", "/auth/v1/token"))
        reconnects = stream_tries(proxy2, "401")
        assert reconnects <= 15, f"{reconnects} stream requests answered 401 in 3 s"
        refreshed = [entry for entry in proxy2.requests("POST", "/auth/v1/token")[refreshes:] if entry[3] == 200]
        assert len(refreshed) >= 2, "the refreshes did not succeed"
        assert js(first, RECORD, "live-5", 1) == 1
        js(first, "await client.sync(); return true")
        wait_until(lambda: len(second.execute_script("return window.live")) >= 16, "events after the 401s")
        assert second.execute_script("return window.live") == list(range(total + 1, total + 17))
        step(f"a stream refused with 401 while refreshes succeed is retried with backoff ({reconnects} tries in 3 s)")

        # A stream answered with a proxy's 401 page (HTML, not the server's refusal): a failure
        # like any page in the way, backed off, and no refresh is spent on it.
        refreshes = len(proxy2.requests("POST", "/auth/v1/token"))
        reconnects = stream_tries(proxy2, "401-page")
        assert reconnects <= 15, f"{reconnects} stream requests answered with a 401 page in 3 s"
        assert len(proxy2.requests("POST", "/auth/v1/token")) == refreshes, "a refresh spent on a 401 page"
        assert js(first, RECORD, "live-6", 1) == 1
        js(first, "await client.sync(); return true")
        wait_until(lambda: len(second.execute_script("return window.live")) >= 17, "events after the 401 pages")
        assert second.execute_script("return window.live") == list(range(total + 1, total + 18))
        step(f"a stream answered with a proxy's 401 page backs off and spends no refresh ({reconnects} tries in 3 s)")

        # 429 and 503 with Retry-After: waited out, then the push goes through.
        open_page(first, proxy.url, {"autoPush": False})
        assert js(first, RECORD, "busy", 1) == 1
        proxy.add_rule("POST", "/sync/v1/events", 429, {"Retry-After": "2"})
        proxy.add_rule("POST", "/sync/v1/events", 503, {"Retry-After": "1"})
        before = len(proxy.requests("POST", "/sync/v1/events"))
        report = js(first, "return await client.sync()")
        assert report["pushed"] == 1, report
        times = [entry[0] for entry in proxy.requests("POST", "/sync/v1/events")[before:]]
        statuses = [entry[3] for entry in proxy.requests("POST", "/sync/v1/events")[before:]]
        assert statuses == [429, 503, 200], statuses
        assert times[1] - times[0] >= 2.0 and times[2] - times[1] >= 1.0, times
        step("429 and 503 with Retry-After honoured")

        # maxBatchEvents 0 is taken as 1 (as the Swift client does), not as batches of none.
        open_page(first, proxy.url, {"autoPush": False, "maxBatchEvents": 0})
        assert js(first, RECORD, "batches-of-one", 2) == 2
        report = js(first, "const r = await client.sync(); return {...r, pending: await client.pendingCount()}")
        assert report["pushed"] == 2 and report["pending"] == 0, report
        exactly_once(server_events(alice), "batches-of-one", 2)
        step("maxBatchEvents 0 pushes batches of one")

        # A proxy's body limit below a batch (nginx's client_max_body_size): the batch is
        # halved until it fits, and that size is kept for the rest of the push rather than
        # sending a full batch, and halving it again, after each one that went through.
        open_page(first, proxy.url, {"autoPush": False, "maxBatchEvents": 16})
        js(first, "for (let n = 0; n < 16; n++)"
                  " await client.record('note', {tag: 'proxy-limit', n, pad: 'x'.repeat(3000)}); return true")
        before = len(proxy.requests("POST", "/sync/v1/events"))
        proxy.max_push_bytes = 16 * 1024  # 4 events of ~3.2 KB fit, 8 do not
        report = js(first, "const r = await client.sync(); return {...r, pending: await client.pendingCount()}")
        proxy.max_push_bytes = None
        assert report["pushed"] == 16 and report["pending"] == 0, report
        statuses = [entry[3] for entry in proxy.requests("POST", "/sync/v1/events")[before:]]
        assert statuses == [413, 413, 200, 200, 200, 200], statuses
        exactly_once(server_events(alice), "proxy-limit", 16)
        step("a proxy's 413 halves the batch, and the size that fit is kept for the rest of the push")

        # A 2xx push answer that does not name the events stored (a 204, a body without
        # results, as a misbehaving proxy gives): nothing leaves the outbox, the sync fails.
        assert js(first, RECORD, "unnamed", 3) == 3
        proxy.add_rule("POST", "/sync/v1/events", 204, {}, "")
        proxy.add_rule("POST", "/sync/v1/events", 200, {}, {"accepted": 3, "duplicates": 0})
        for _ in range(2):
            failed = js(first, "try { await client.sync(); return 'synced' } catch (e) { return e.code || String(e) }")
            assert failed == "invalid_response", failed
            assert js(first, "return await client.pendingCount()") == 3
        report = js(first, "const r = await client.sync(); return {...r, pending: await client.pendingCount()}")
        assert report["pending"] == 0 and report["pushed"] + report["duplicates"] == 3, report
        exactly_once(server_events(alice), "unnamed", 3)
        step("a 2xx push answer that names no event stored removes nothing from the outbox")

        # An answer naming some events of a batch stored, not others (holes between them):
        # those named leave the outbox, each one not named stays and is pushed next time.
        assert js(first, RECORD, "partly", 5) == 5
        outbox = ("const db = await client.current().db(); const r = db.transaction('outbox')"
                  ".objectStore('outbox').getAll(); return await new Promise((resolve) => {"
                  " r.onsuccess = () => resolve(r.result.map((e) => e.client_id)) })")
        ids = js(first, outbox)
        assert len(ids) == 5, ids
        named = [ids[0], ids[2], ids[3]]
        proxy.add_rule("POST", "/sync/v1/events", 200, {},
                       {"results": [{"client_id": i, "status": "created"} for i in named]})
        failed = js(first, "try { await client.sync(); return 'synced' } catch (e) { return e.code || String(e) }")
        assert failed == "invalid_response", failed
        assert js(first, outbox) == [ids[1], ids[4]], js(first, outbox)
        report = js(first, "const r = await client.sync(); return {...r, pending: await client.pendingCount()}")
        assert report["pending"] == 0 and report["pushed"] == 2, report
        step("a push answer naming only some events removes those, in runs, and keeps the others")

        # A pull answer that is not the server's (a proxy's own JSON, a stale page from before
        # the cursor): the sync fails with invalid_response, and the cursor stays where it is.
        js(first, "await client.sync(() => {}); return true")
        before = js(first, CURSOR)
        assert before > 0, before
        proxy.add_rule("GET", "/sync/v1/events", 200, {}, {"events": [], "next_after": 0, "has_more": False})
        proxy.add_rule("GET", "/sync/v1/events", 200, {}, {"message": "down for maintenance"})
        for _ in range(2):
            failed = js(first, SYNC_OUTCOME)
            assert failed == "invalid_response", failed
            assert js(first, CURSOR) == before
        step("a pull answer that is not the server's fails the sync and leaves the cursor")

        # A push answer that never comes: the request times out and is tried again (the
        # server has the event by then: a duplicate), instead of holding the sync lock.
        open_page(first, proxy.url, {"autoPush": False, "requestTimeout": 1500, "retry": {"baseDelay": 50}})
        assert js(first, RECORD, "lost-answer", 1) == 1
        before = len(proxy.requests("POST", "/sync/v1/events"))
        proxy.push_delay = 60
        first.execute_script("window.slow = client.sync().then((r) => r, (e) => String(e))")
        wait_until(lambda: len(proxy.requests("POST", "/sync/v1/events")) > before, "the push at the server")
        proxy.push_delay = 0
        report = js(first, "return await window.slow")
        assert isinstance(report, dict) and report["duplicates"] == 1 and report["pushed"] == 0, report
        exactly_once(server_events(alice), "lost-answer", 1)
        step("a push answer that never came timed out and the push was tried again")

        # An access token refused mid-sync (what an expired one gets): refreshed once, the
        # sync goes on from the same page.
        open_page(first, proxy.url, {"autoPush": False, "pageSize": 100})
        refresh_before = first.execute_script(
            "return JSON.parse(localStorage.getItem('trunk-sync|session|' + client.url)).refresh_token")
        proxy.add_rule("GET", "/sync/v1/events", 401, {}, {"code": "invalid_token", "message": "expired"}, skip=2)
        js(first, "await client.sync(() => {}); return true")  # up to date
        js(first, "const db = await client.current().db(); await new Promise((resolve) => {"
                  " const tx = db.transaction('meta', 'readwrite'); tx.objectStore('meta').put(0, 'cursor');"
                  " tx.oncomplete = resolve }); return true")  # from the start again: many pages
        report = js(first, "const seqs = []; const r = await client.sync((events) => { seqs.push(...events.map(e => e.seq)) });"
                           "return {...r, seqs}")
        total = len(server_events(alice))
        assert report["seqs"] == list(range(1, total + 1)), (report["pulled"], total)
        refresh_after = first.execute_script(
            "return JSON.parse(localStorage.getItem('trunk-sync|session|' + client.url)).refresh_token")
        assert refresh_after != refresh_before and len(proxy.requests("POST", "/auth/v1/token")) == 1
        # An access token past its expiry here is refreshed before it is used.
        first.execute_script(EXPIRE)
        assert js(first, RECORD, "after-expiry", 1) == 1
        js(first, "await client.sync(); return true")
        assert len(proxy.requests("POST", "/auth/v1/token")) == 2
        exactly_once(server_events(alice), "after-expiry", 1)
        step("token expiry mid-sync: refreshed and the sync went on")

        # Two tabs whose token expired at once: one refresh serves both (the refresh token
        # rotates, so a second use would be a reuse).
        refreshes = len(proxy.requests("POST", "/auth/v1/token"))
        tab_a = first.current_window_handle
        tab_b = new_tab(first, proxy.url, {"autoPush": False})
        for handle in (tab_a, tab_b):
            first.switch_to.window(handle)
            first.execute_script(EXPIRE)
        for handle in (tab_a, tab_b):
            first.switch_to.window(handle)
            first.execute_script("window.both = client.sync(() => {}).then(() => true, (e) => String(e))")
        for handle in (tab_a, tab_b):
            first.switch_to.window(handle)
            assert js(first, "return await window.both") is True
        assert len(proxy.requests("POST", "/auth/v1/token")) == refreshes + 1, proxy.requests("POST", "/auth/v1/token")
        first.switch_to.window(tab_b)
        first.close()
        first.switch_to.window(tab_a)
        step("one token refresh shared by two tabs")

        # A refused event goes to the quarantine; the rest are pushed.
        report = js(first, "await client.record('note', {tag: 'q', n: 0});"
                           "const bad = await client.record('note', {tag: 'q-bad', text: 'a\\u0000b'});"
                           "await client.record('note', {tag: 'q', n: 1});"
                           "const r = await client.sync();"
                           "const q = await client.quarantinedEvents();"
                           "return {...r, bad, q, pending: await client.pendingCount()}")
        assert report["pushed"] == 2 and report["pending"] == 0, report
        assert [event["client_id"] for event in report["q"]] == [report["bad"]], report
        assert report["q"][0]["field"] and report["q"][0]["reason"], report
        assert [r["client_id"] for r in report["rejected"]] == [report["bad"]], report
        exactly_once(server_events(alice), "q", 2)
        step("a refused event quarantined, the others pushed")

        # The leader's background push tells the app what it cannot see otherwise.
        open_page(first, proxy.url)
        wait_until(lambda: js(first, "return client.isLeader"), "the leader")
        js(first, "window.states = []; client.onStateChange((state, detail) => window.states.push("
                  "[state, detail && (detail.code || detail.map?.((e) => e.client_id))])); return true")
        states = lambda: first.execute_script("return window.states")
        bad = js(first, "return await client.record('note', {tag: 'told-bad', text: 'a\\u0000b'})")
        wait_until(lambda: ["rejected", [bad]] in states(), "'rejected' with the event")
        offline(first, True)
        assert js(first, RECORD, "told", 1) == 1
        wait_until(lambda: ["push_failed", "network"] in states(), "'push_failed' with the error")
        offline(first, False)
        wait_until(lambda: js(first, "return await client.pendingCount()") == 0, "the push once back online")
        exactly_once(server_events(alice), "told", 1)
        # Events leaving the outbox are told in every tab, for a count of unsent events.
        wait_until(lambda: ["pushed", None] in states(), "'pushed' in the leader")
        leader = first.current_window_handle
        follower = new_tab(first, proxy.url)
        js(first, "window.pushed = 0; client.onStateChange((state) => { if (state === 'pushed') window.pushed++ });"
                  "return true")
        first.switch_to.window(leader)
        assert js(first, RECORD, "told-tabs", 1) == 1
        wait_until(lambda: js(first, "return await client.pendingCount()") == 0, "the leader's push")
        first.switch_to.window(follower)
        wait_until(lambda: first.execute_script("return window.pushed") >= 1, "'pushed' in the other tab")
        first.close()
        first.switch_to.window(leader)
        # The server ended the session: the refresh it refuses signs out, and the app hears it.
        session = js(first, "return JSON.parse(localStorage.getItem('trunk-sync|session|' + client.url))")
        api("POST", "/auth/v1/logout?scope=local", {}, session["access_token"])
        first.execute_script(EXPIRE)
        assert js(first, RECORD, "told-late", 1) == 1
        wait_until(lambda: ["signed_out", None] in states(), "'signed_out'")
        assert not js(first, "return client.isSignedIn")
        sign_in(first, ALICE)
        js(first, "await client.sync(); return true")
        exactly_once(server_events(alice), "told-late", 1)
        step("the app is told of a refused event, a failed push and a sign-out by the server")
        step("'pushed' is told in every tab")

        # A "recorded" message the leader never got (a tab closed as it posted): the leader
        # looks at the outbox again when the page becomes visible (or on a slow timer).
        wait_until(lambda: js(first, "return client.isLeader"), "the leader")
        js(first, "const push = client.schedulePush; client.schedulePush = () => {};"
                  "try { await client.record('note', {tag: 'unannounced', n: 0}) } finally { client.schedulePush = push }"
                  "return true")
        assert js(first, "return await client.pendingCount()") == 1
        first.execute_script("document.dispatchEvent(new Event('visibilitychange'))")
        wait_until(lambda: js(first, "return await client.pendingCount()") == 0, "the push after visibilitychange")
        exactly_once(server_events(alice), "unannounced", 1)
        step("an event whose announcement was lost is pushed when the page becomes visible")

        # A type's length counts Unicode scalars, as the server does (not UTF-16 units).
        wide = js(first, "const id = await client.record('\\u{1F600}'.repeat(128), {tag: 'wide'});"
                         "let refused = null; try { await client.record('\\u{1F600}'.repeat(129), {}) }"
                         " catch (e) { refused = e.code } await client.sync(); return [id, refused]")
        assert wide[1] == "invalid_event", wide
        stored = [e for e in server_events(alice) if e["client_id"] == wide[0]]
        assert len(stored) == 1 and stored[0]["type"] == "\U0001F600" * 128, stored
        step("a type of 128 characters outside the BMP is recorded and stored")
        open_page(first, proxy.url, {"autoPush": False})

        # Two accounts in one browser: outboxes and cursors apart.
        assert js(first, RECORD, "apart-alice", 3) == 3
        sign_in(first, CAROL)
        assert js(first, "return await client.pendingCount()") == 0
        assert js(first, RECORD, "apart-carol", 2) == 2
        report = js(first, "const seen = []; const r = await client.sync((e) => { seen.push(...e) });"
                           "return {...r, tags: seen.map(e => e.payload.tag)}")
        assert report["tags"] == ["apart-carol", "apart-carol"], report
        carol = api_token(CAROL)
        assert [e["payload"]["tag"] for e in server_events(carol)] == ["apart-carol"] * 2
        assert tagged(server_events(alice), "apart-alice") == []
        sign_in(first, ALICE)
        assert js(first, "return await client.pendingCount()") == 3
        js(first, "await client.sync(); return true")
        exactly_once(server_events(alice), "apart-alice", 3)
        names = js(first, "return (await indexedDB.databases()).map(d => d.name)")
        assert len([name for name in names if name.startswith("trunk-sync|" + proxy.url)]) == 2, names
        step("two accounts in one browser kept apart")

        # A live iterator is for the user it was opened for: another user signed in ends it,
        # and none of their events reach it; opened with nobody signed in, it ends at once.
        open_page(first, proxy.url)
        js(first, "window.liveDone = false; window.liveSeen = [];"
                  "(async () => { for await (const e of client.liveEvents()) window.liveSeen.push(e.payload.tag);"
                  " window.liveDone = true })(); return true")
        sign_in(first, CAROL)
        wait_until(lambda: js(first, "return window.liveDone"), "the iterator ended at the switch")
        assert js(first, RECORD, "carol-live", 1) == 1
        js(first, "await client.sync(); return true")
        assert "carol-live" not in js(first, "return window.liveSeen")
        js(first, "await client.signOut(); return true")
        assert js(first, "const it = client.liveEvents(); return (await it.next()).done")
        sign_in(first, ALICE)
        step("a live iterator ends when another user is signed in, and is empty signed out")

        # Signing out keeps unsent events unless asked to discard them.
        open_page(first, proxy.url, {"autoPush": False})
        offline(first, True)
        assert js(first, RECORD, "kept", 2) == 2
        assert js(first, "return (await client.signOut()).unsentEvents") == 2
        assert not js(first, "return client.isSignedIn")
        offline(first, False)
        sign_in(first, ALICE)
        assert js(first, "return await client.pendingCount()") == 2
        js(first, "await client.sync(); return true")
        exactly_once(server_events(alice), "kept", 2)
        offline(first, True)
        assert js(first, RECORD, "discarded", 2) == 2
        assert js(first, "return (await client.signOut({discard: true})).unsentEvents") == 0
        offline(first, False)
        sign_in(first, ALICE)
        assert js(first, "return await client.pendingCount()") == 0
        step("sign-out kept the unsent events for the next sign-in, or discarded them when asked")

        # Another tab signs someone else in while this one signs out (its push held at the
        # proxy): the sign-out revokes its own session with its own token, leaves the other
        # tab's session alone and counts its own user's unsent events.
        quiet = {"autoPush": False, "live": False}
        open_page(first, proxy.url, quiet)
        tab_a = first.current_window_handle
        tab_b = new_tab(first, proxy.url, quiet)
        first.switch_to.window(tab_a)
        before = stored_session(first)
        assert js(first, RECORD, "swapped", 1) == 1
        arrived, release = proxy.hold("POST", "/sync/v1/events")
        first.execute_script("window.out = client.signOut().then((r) => r, (e) => String(e))")
        assert arrived.wait(TIMEOUT), "the sign-out's push"
        first.switch_to.window(tab_b)
        sign_in(first, CAROL)
        first.switch_to.window(tab_a)
        result = js(first, "return await window.out")
        release.set()
        assert result == {"unsentEvents": 1}, result
        after = stored_session(first)
        assert after["email"] == CAROL and js(first, "return client.user.email") == CAROL, after
        api("GET", "/auth/v1/user", token=after["access_token"])  # the other tab's session works
        assert failed_status(lambda: api("GET", "/auth/v1/user", token=before["access_token"])) in (401, 403)
        step("sign-out ends its own session, not the one another tab signed in meanwhile")

        # reauthenticate and deleteAccount act for the user signed in when called: once
        # another tab signed someone else in they fail with user_changed, never sending with
        # the other user's session. reauthenticate: its first answer (a 401) held until then.
        sent = len(proxy.requests("POST", "/auth/v1/reauthenticate"))
        arrived, release = proxy.hold("POST", "/auth/v1/reauthenticate")
        proxy.add_rule("POST", "/auth/v1/reauthenticate", 401, {}, {"code": "invalid_token", "message": "expired"})
        first.execute_script("window.out = client.reauthenticate().then(() => 'sent', (e) => e.code || String(e))")
        assert arrived.wait(TIMEOUT), "the reauthentication"
        erin = f"erin-{RUN}@example.com"  # a fresh address: ALICE's codes this hour are running out
        first.switch_to.window(tab_b)
        sign_in(first, erin)
        first.switch_to.window(tab_a)
        wait_until(lambda: js(first, "return client.user.email") == erin, "the other tab's sign-in seen")
        release.set()
        assert js(first, "return await window.out") == "user_changed"
        assert len(proxy.requests("POST", "/auth/v1/reauthenticate")) == sent + 1, "sent again as the other user"
        # deleteAccount: its token expired, the refresh before the request held until then;
        # the refreshed session does not overwrite the one the other tab stored.
        first.execute_script(EXPIRE)
        arrived, release = proxy.hold("POST", "/auth/v1/token")
        first.execute_script("window.out = client.deleteAccount('000000')"
                             ".then(() => 'deleted', (e) => e.code || String(e))")
        assert arrived.wait(TIMEOUT), "the refresh"
        first.switch_to.window(tab_b)
        sign_in(first, CAROL)
        carol_session = stored_session(first)
        first.switch_to.window(tab_a)
        wait_until(lambda: js(first, "return client.user.email") == CAROL, "the other tab's sign-in seen")
        release.set()
        assert js(first, "return await window.out") == "user_changed"
        assert proxy.requests("DELETE", "/sync/v1/account") == [], "sent as the other user"
        assert stored_session(first) == carol_session
        api("GET", "/auth/v1/user", token=carol_session["access_token"])
        first.switch_to.window(tab_b)
        first.close()
        first.switch_to.window(tab_a)
        step("reauthenticate and deleteAccount never go on for a user another tab signed in")

        # A tab still running the previous version of the module (loaded before the server
        # was upgraded) refreshes the session while this tab signs out (its push held at the
        # proxy), and stores it as that version does: without the `id` this one gives
        # sessions. It is the same session: signOut still ends it.
        old = stored_session(first)
        assert old.get("id"), old
        assert js(first, RECORD, "legacy", 1) == 1
        arrived, release = proxy.hold("POST", "/sync/v1/events")
        first.execute_script("window.out = client.signOut().then((r) => r, (e) => String(e))")
        assert arrived.wait(TIMEOUT), "the sign-out's push"
        body = api("POST", "/auth/v1/token?grant_type=refresh_token", {"refresh_token": old["refresh_token"]})
        legacy = {"access_token": body["access_token"], "refresh_token": body["refresh_token"],
                  "expires_in": body["expires_in"], "expires_at": int(time.time()) + int(body["expires_in"]),
                  "user_id": body["user"]["id"], "email": body["user"].get("email")}
        first.switch_to.new_window("tab")
        first.get(f"{PAGE_ORIGIN}/")
        first.execute_script("localStorage.setItem(arguments[0], arguments[1])",
                             f"trunk-sync|session|{proxy.url}", json.dumps(legacy))
        first.close()
        first.switch_to.window(tab_a)
        wait_until(lambda: js(first, "return client.session.access_token") == legacy["access_token"],
                   "the old tab's refresh seen")
        release.set()
        assert js(first, "return await window.out") == {"unsentEvents": 0}
        assert not js(first, "return client.isSignedIn"), "still signed in after signOut"
        assert stored_session(first) is None, stored_session(first)
        assert failed_status(lambda: api("GET", "/auth/v1/user", token=legacy["access_token"])) in (401, 403)
        sign_in(first, CAROL)
        step("sign-out ends its session also when a tab of the previous version refreshed it (no id)")

        # A token refresh on a slow connection outlives its session: another tab signs out
        # (revoking it) and signs someone else in before the refresh's answer comes, a 400.
        # That refusal is about the old session: the other tab's stays signed in.
        tab_c = new_tab(first, proxy.url, quiet)
        first.switch_to.window(tab_a)
        arrived, release = proxy.hold("POST", "/auth/v1/token")
        proxy.add_rule("POST", "/auth/v1/reauthenticate", 401, {}, {"code": "invalid_token", "message": "expired"})
        first.execute_script("window.out = client.reauthenticate().then(() => 'sent', (e) => e.code || String(e))")
        assert arrived.wait(TIMEOUT), "the refresh"
        first.switch_to.window(tab_c)
        js(first, "await client.signOut();")
        sign_in(first, erin)
        other = stored_session(first)
        first.switch_to.window(tab_a)
        wait_until(lambda: js(first, "return client.user && client.user.email") == erin, "the other tab's sign-in seen")
        release.set()
        assert js(first, "return await window.out") in ("user_changed", "session_expired")
        assert stored_session(first) == other, stored_session(first)
        api("GET", "/auth/v1/user", token=other["access_token"])
        first.switch_to.window(tab_c)
        first.close()
        first.switch_to.window(tab_a)
        sign_in(first, CAROL)
        step("a refresh refused after its session ended leaves the session another tab signed in")

        # signOut({discard: true}) while another tab signs the same user in again (its logout
        # held at the proxy): the outbox is that new session's now, and the event it recorded
        # meanwhile stays, as does that session.
        tab_c = new_tab(first, proxy.url, quiet)
        first.switch_to.window(tab_a)
        arrived, release = proxy.hold("POST", "/auth/v1/logout")
        first.execute_script("window.out = client.signOut({discard: true}).then((r) => r, (e) => String(e))")
        assert arrived.wait(TIMEOUT), "the sign-out's logout"
        first.switch_to.window(tab_c)
        sign_in(first, CAROL)
        again = stored_session(first)
        assert js(first, RECORD, "kept", 1) == 1
        first.switch_to.window(tab_a)
        wait_until(lambda: js(first, "return client.session && client.session.id") == again["id"],
                   "the other tab's sign-in seen")
        release.set()
        out = js(first, "return await window.out")
        assert out == {"unsentEvents": 1}, out
        first.switch_to.window(tab_c)
        assert js(first, "return await client.pendingCount()") == 1, "the new session's event was discarded"
        assert stored_session(first) == again
        first.close()
        first.switch_to.window(tab_a)
        step("sign-out with discard leaves the outbox of the same user signed in again in another tab")

        # Another tab's sign-in seen only once signOut's refresh runs (its storage event not
        # delivered yet: written here, where none fires), the logout refused as expired:
        # signOut still revokes its own session with its own token.
        own = stored_session(first)
        count = len(mails_to(erin)) + 1
        wait_until(lambda: try_otp(erin), f"a code for {erin}")
        body = api("POST", "/auth/v1/verify", {"email": erin, "token": code_for(erin, count), "type": "email"})
        other = {"access_token": body["access_token"], "refresh_token": body["refresh_token"],
                 "expires_in": body["expires_in"], "expires_at": int(time.time()) + int(body["expires_in"]),
                 "user_id": body["user"]["id"], "email": erin, "id": "another-tab"}
        arrived, release = proxy.hold("POST", "/auth/v1/logout")
        proxy.add_rule("POST", "/auth/v1/logout", 401, {}, {"code": "invalid_token", "message": "expired"})
        first.execute_script("window.out = client.signOut().then((r) => r, (e) => String(e))")
        assert arrived.wait(TIMEOUT), "the sign-out's logout"
        first.execute_script("localStorage.setItem(arguments[0], arguments[1])",
                             f"trunk-sync|session|{proxy.url}", json.dumps(other))
        release.set()
        out = js(first, "return await window.out")
        assert out == {"unsentEvents": 0}, out
        assert stored_session(first) == other
        assert failed_status(lambda: api("GET", "/auth/v1/user", token=own["access_token"])) in (401, 403)
        step("sign-out revokes its session when another tab's sign-in is seen only at its refresh")

        # Signing out offline while IndexedDB refuses to open: signed out all the same, and the
        # discard asked for (and forgetting the cursor) happens at the next opening.
        open_page(first, proxy.url, {"autoPush": False, "live": False})
        who = js(first, "return client.user.email")
        js(first, "await client.sync(() => {}); return true")
        offline(first, True)
        assert js(first, RECORD, "refused-db", 2) == 2
        out = js(first, "const open = indexedDB.open;"
                        "indexedDB.open = () => { throw new DOMException('denied', 'SecurityError') };"
                        "try { return await client.signOut({discard: true}) } finally { indexedDB.open = open }")
        offline(first, False)
        assert out == {"unsentEvents": None}, out
        assert not js(first, "return client.isSignedIn") and stored_session(first) is None
        sign_in(first, who)
        assert js(first, "return await client.pendingCount()") == 0
        assert js(first, CURSOR) is None, "the cursor was not forgotten"
        assert tagged(server_events(api_token(who)), "refused-db") == []
        step("sign-out with IndexedDB refusing signs out, and the discard happens at the next opening")

        # The browser refuses persistent storage: the app is told, to warn the user.
        for granted in (False, True):
            persisted = js(first, "const persist = navigator.storage.persist;"
                                  "navigator.storage.persist = async () => args[1];"
                                  "const c = new TrunkSync.TrunkSyncClient({url: args[0], autoPush: false, live: false});"
                                  "navigator.storage.persist = persist;"
                                  "const states = []; c.onStateChange((state) => states.push(state));"
                                  "while (c.storagePersisted === null) await new Promise((r) => setTimeout(r, 10));"
                                  "c.close(); return [c.storagePersisted, states.includes('storage_not_persisted')]",
                           proxy.url, granted)
            assert persisted == [granted, not granted], persisted
        step("persistent storage refused is told (storagePersisted, 'storage_not_persisted')")

        # No IndexedDB (as in some private modes): record refuses, nothing kept in memory.
        first.get(f"{PAGE_ORIGIN}/")
        wait_until(lambda: first.execute_script("return window.ready === true"), "the module")
        refused = js(first, "indexedDB.open = () => { throw new DOMException('denied', 'SecurityError') };"
                            "const client = new TrunkSync.TrunkSyncClient({url: args[0]});"
                            "try { await client.record('note', {n: 1}); return 'recorded' }"
                            "catch (e) { return [e.code, e.message] }", proxy.url)
        assert refused[0] == "storage_unavailable" and "IndexedDB" in refused[1], refused
        step("without IndexedDB, record refuses clearly")
        open_page(first, proxy.url, {"autoPush": False})

        # A write the browser does not commit (the disk or the origin's quota full: the
        # transaction aborts). Chromium's quota cannot be lowered from a test, so the outbox's
        # add is made to abort its transaction as such a write does.
        quota = js(first, "const before = await client.pendingCount();"
                          "const add = IDBObjectStore.prototype.add;"
                          "IDBObjectStore.prototype.add = function (...a) {"
                          "  const request = add.apply(this, a); this.transaction.abort(); return request };"
                          "let outcome;"
                          "try { await client.record('note', {n: 'lost'}); outcome = ['recorded'] }"
                          "catch (e) { outcome = [e.code, e.message] }"
                          "finally { IDBObjectStore.prototype.add = add }"
                          "const after = await client.pendingCount();"
                          "await client.record('note', {n: 'kept'});"
                          "return [...outcome, before, after, await client.pendingCount()]")
        assert quota[0] == "storage_unavailable" and "did not commit" in quota[1], quota
        assert quota[3] == quota[2] and quota[4] == quota[2] + 1, quota
        step("a write IndexedDB does not commit rejects with storage_unavailable, nothing kept")

        # An export whose body stops coming: aborted after requestTimeout without data.
        open_page(first, proxy.url, {"autoPush": False, "live": False, "requestTimeout": 1500})
        proxy.stall_export = True
        stalled = js(first, "return await Promise.race([client.exportData().then(() => 'exported', (e) => [e.code, e.message]),"
                            " new Promise((resolve) => setTimeout(() => resolve('still waiting'), 30000))])")
        proxy.stall_export = False
        assert stalled[0] == "network" and "stalled" in stalled[1], stalled
        step("an export whose body stalls is aborted with a network error")

        # A 200 page of something in the way (a captive portal) is not the export.
        proxy.add_rule("GET", "/sync/v1/export", 200, *PAGE_IN_THE_WAY)
        portal = js(first, "return await client.exportData().then((b) => ['exported', b.type], (e) => [e.code, e.message])")
        assert portal[0] == "invalid_response" and "text/html" in portal[1], portal
        step("an export answered with a page in the way is refused, not handed out as the copy")

        # An export whose end line is lost on the way where the break does not show (a proxy
        # that passes on what it got and closes the connection), or whose end line does not
        # count what came: refused, nothing handed out as the copy.
        def lines(data):
            return data.split(b"\n")[:-1]  # each line ends with a newline

        for rewrite, reason in [
            (lambda data: b"".join(line + b"\n" for line in lines(data)[:-1]), "no end line"),
            (lambda data: re.sub(rb'"events":(\d+)(,"last_seq":\d+\}\n)$',
                                 lambda m: b'"events":%d%s' % (int(m[1]) + 1, m[2]), data),
             "the end line counts"),
            (lambda data: data + lines(data)[-1] + b"\n", "goes on after its end line"),
        ]:
            proxy.rewrite_export = rewrite
            cut = js(first, "return await client.exportData().then((b) => ['exported', b.size], (e) => [e.code, e.message])")
            assert proxy.rewrite_export is None, "the export went through the proxy"
            assert cut[0] == "incomplete_export" and reason in cut[1], (reason, cut)
        step("an export cut short where the break did not show is refused, not handed out as the copy")

        blob = js(first, "const b = await client.exportData(); const lines = (await b.text()).split('\\n');"
                         " return [b.type, lines[0], lines.at(-2), lines.length]")
        assert '"kind":"account"' in blob[1], blob
        assert re.fullmatch(r'\{"kind":"end","events":\d+,"last_seq":\d+\}', blob[2]), blob
        step("exported the account as NDJSON")

        # The example page (examples/web), as a person uses it, with the served module.
        dave = f"dave-{RUN}@example.com"
        sign_in_on_page(first, f"{PAGE_ORIGIN}/example/?server={API}", "#email-form", "#code-form", dave)
        wait_until(lambda: element_shows(first, "#note-form"), "the signed-in page")
        submit(first, "#note-form", "hello from the example")
        # Recorded, pushed by the leader tab and back over the live stream into the list.
        wait_until(lambda: element_shows(first, "#notes", "hello from the example"), "the note listed")
        assert [e["payload"]["text"] for e in server_events(api_token(dave))] == ["hello from the example"]
        first.refresh()
        wait_until(lambda: element_shows(first, "#notes", "hello from the example"), "the note after a reload")
        step("the example page signs in, records and lists a note")
        example_page_keeps_every_note(first, dave)
        example_page_tabs_keep_each_others_notes(first, dave)

        # Deleting the account: a mailed confirmation code, then everything is gone, here too.
        dave_token = api_token(dave)
        open_page(first, API, {"autoPush": False})
        assert js(first, "return client.user.email") == dave
        mails = len(mails_to(dave))
        wait_until(lambda: js(first, "try { await client.reauthenticate(); return true } catch (e) {"
                                     " if (e.status === 429) { await new Promise(r => setTimeout(r, e.retryAfter || 1000));"
                                     " return false } throw e }"), "a confirmation code")
        code = code_for(dave, mails + 1)
        refused = js(first, "try { await client.deleteAccount('000000'); return 'deleted' } catch (e) { return e.status }")
        assert refused == 400 and js(first, "return client.isSignedIn")
        js(first, "await client.deleteAccount(args[0]); return true", code)
        assert not js(first, "return client.isSignedIn")
        names = js(first, "return (await indexedDB.databases()).map(d => d.name)")
        assert not [name for name in names if name.startswith("trunk-sync|" + API + "|")], names
        try:
            server_events(dave_token)
            raise AssertionError("the deleted account's token still works")
        except urllib.error.HTTPError as error:
            assert error.code == 401, error.code
        step("deleted the account with a mailed code, and its local data")

        # The deletion's answer lost (the server deleted, the answer never came): not claimed
        # done, but signed out and the user's data here removed, unsent events included.
        gil = f"gil-{RUN}@example.com"
        open_page(first, proxy.url, {"autoPush": False, "live": False, "requestTimeout": 1500})
        sign_in(first, gil)
        gil_token = api_token(gil)
        gil_id = js(first, "return client.user.id")
        assert js(first, RECORD, "deleted-unsent", 1) == 1
        mails = len(mails_to(gil))
        wait_until(lambda: js(first, "try { await client.reauthenticate(); return true } catch (e) {"
                                     " if (e.status === 429) { await new Promise(r => setTimeout(r, e.retryAfter || 1000));"
                                     " return false } throw e }"), "a confirmation code")
        code = code_for(gil, mails + 1)
        answered, release = proxy.hold_answer("DELETE", "/sync/v1/account")
        out = js(first, "try { await client.deleteAccount(args[0]); return 'deleted' } catch (e) { return [e.code, e.message] }",
                 code)
        release.set()
        assert answered.is_set() and out[0] == "outcome_unknown", out
        assert not js(first, "return client.isSignedIn") and stored_session(first) is None
        names = js(first, "return (await indexedDB.databases()).map(d => d.name)")
        assert f"trunk-sync|{proxy.url}|{gil_id}" not in names, names
        assert failed_status(lambda: server_events(gil_token)) == 401
        step("a deletion whose answer was lost is not claimed, and signs out and removes the local data")
        guide_page_works(first)
        answers_not_the_servers(first)
        a_record_the_browser_cannot_read_blocks_nothing(proxy)
        a_record_that_fails_to_read_for_a_while_is_kept(proxy)
    finally:
        first.quit()
        if second:
            second.quit()
        page.shutdown()


def as_stored(session, address):
    """`session` (the server's answer to /verify) as the client stores it in localStorage."""
    return {"access_token": session["access_token"], "refresh_token": session["refresh_token"],
            "expires_in": session["expires_in"], "expires_at": int(time.time()) + int(session["expires_in"]),
            "user_id": session["user"]["id"], "email": address, "id": str(uuid.uuid4())}


def example_page_keeps_every_note(driver, address):
    """The example page (examples/web) through a proxy of its own, signed in as `address`:
    a note the browser does not store stays in the field, the failure shown; a note another
    device adds while the page's first sync is under way (committed after its last page was
    read, streamed before the sync ended) is listed at once, not only at the next visit."""
    proxy = Proxy()
    session = api_session(address)
    token = session["access_token"]
    stored = as_stored(session, address)
    driver.get(f"{PAGE_ORIGIN}/example/?server={proxy.url}")
    driver.execute_script("localStorage.setItem(arguments[0], arguments[1])",
                          f"trunk-sync|session|{proxy.url}", json.dumps(stored))
    # The browser's answer to persist() held until the test gives it (a refusal).
    held = driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {
        "source": "navigator.storage.persist = () => new Promise((resolve) => { window.answerPersist = resolve })"})
    driver.refresh()
    driver.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", {"identifier": held["identifier"]})
    # Its last change of state (leading the account) shown: a message shown after it stays.
    wait_until(lambda: element_shows(driver, "#status", "this tab syncs"), "the page leading its account")

    # IndexedDB does not commit the outbox's write (a full disk or quota; see the quota step).
    driver.execute_script("const add = IDBObjectStore.prototype.add;"
                          "window.restoreAdd = () => { IDBObjectStore.prototype.add = add };"
                          "IDBObjectStore.prototype.add = function (...a) {"
                          "  const request = add.apply(this, a); this.transaction.abort(); return request }")
    field = driver.find_element(By.CSS_SELECTOR, "#note-form input")
    field.send_keys("a note the disk refused")
    driver.find_element(By.CSS_SELECTOR, "#note-form button").click()
    wait_until(lambda: element_shows(driver, "#status", "not saved"), "the failure shown")
    assert field.get_attribute("value") == "a note the disk refused", field.get_attribute("value")
    # Persistent storage refused now: a warning of its own, the message shown stays.
    wait_until(lambda: driver.execute_script("return typeof window.answerPersist === 'function'"), "persist() asked")
    driver.execute_script("window.answerPersist(false)")
    wait_until(lambda: element_shows(driver, "#storage-warning", "may clear notes"), "the storage warning")
    assert element_shows(driver, "#status", "not saved"), driver.find_element(By.ID, "status").text
    driver.execute_script("window.restoreAdd()")
    driver.find_element(By.CSS_SELECTOR, "#note-form button").click()
    wait_until(lambda: element_shows(driver, "#notes", "a note the disk refused"), "the note, sent again, listed")
    assert field.get_attribute("value") == ""
    step("the example page keeps a note the browser did not store in its field, and says so")
    step("the example page warns that storage may be cleared, without hiding its message")

    answered, release = proxy.hold_answer("GET", "/sync/v1/events")
    driver.refresh()
    assert answered.wait(TIMEOUT), "the first sync's pull"
    seq = push(token, "added while the page synced")
    database = f"trunk-sync|{proxy.url}|{session['user']['id']}"
    streamed = ("const db = await new Promise((resolve, reject) => { const r = indexedDB.open(args[0]);"
                " r.onsuccess = () => resolve(r.result); r.onerror = () => reject(r.error) });"
                "const r = db.transaction('meta').objectStore('meta').get('live');"
                "const live = await new Promise((resolve) => { r.onsuccess = () => resolve(r.result) });"
                "db.close(); return live ?? -1")
    wait_until(lambda: js(driver, streamed, database) >= seq, "the note streamed to the page")
    release.set()
    wait_until(lambda: element_shows(driver, "#notes", "added while the page synced"), "the note listed")
    step("the example page lists a note another device added during its first sync")

    # The live event of a note comes before the push's answer (held here), while the note is
    # still in the outbox; the count of unsent notes follows the answer (it stayed at 1).
    answered, release = proxy.hold_answer("POST", "/sync/v1/events")
    submit(driver, "#note-form", "counted once sent")
    assert answered.wait(TIMEOUT), "the push"
    wait_until(lambda: element_shows(driver, "#notes", "counted once sent"), "the note streamed and listed")
    wait_until(lambda: element_shows(driver, "#status", " · 1 unsent"), "the note counted as unsent")
    release.set()
    wait_until(lambda: element_shows(driver, "#status", " · 0 unsent"), "the count after the push's answer")
    step("the example page's count of unsent notes follows the push's answer, after the note's live event")


def example_page_tabs_keep_each_others_notes(driver, address):
    """Two tabs of the example page share the sync cursor: a note one tab pulled (and the
    other never will) stays listed after the other tab stores a note of its own. The notes
    an earlier version of the page kept in one item are carried over. No live stream here
    (the proxy answers it with a silent one), so notes come by sync alone, in a set order."""
    proxy = Proxy()
    proxy.fake_stream = "silent"
    session = api_session(address)
    token, user_id = session["access_token"], session["user"]["id"]
    stored = as_stored(session, address)
    url = f"{PAGE_ORIGIN}/example/?server={proxy.url}"
    old_key = f"notes-example|{proxy.url}|{user_id}"
    old_note = {"seq": 10**12, "text": "kept by the page before", "created_at": "2026-11-01T00:00:00.000Z"}
    driver.get(url)
    driver.execute_script("localStorage.setItem(arguments[0], arguments[1]);"
                          "localStorage.setItem(arguments[2], arguments[3])",
                          f"trunk-sync|session|{proxy.url}", json.dumps(stored), old_key, json.dumps([old_note]))
    driver.refresh()
    tab_a = driver.current_window_handle
    wait_until(lambda: element_shows(driver, "#notes", "kept by the page before"), "the earlier version's note")
    # Both of the page's first syncs over (each pulls; none holds the sync lock any more).
    syncing = "return (await navigator.locks.query()).held.filter((l) => l.name.startsWith('trunk-sync|sync|')).length"
    wait_until(lambda: len(proxy.requests("GET", "/sync/v1/events")) >= 2 and js(driver, syncing) == 0,
               "tab A's first syncs")
    assert driver.execute_script("return localStorage.getItem(arguments[0])", old_key) is None
    push(token, "pulled by tab B")
    driver.switch_to.new_window("tab")
    tab_b = driver.current_window_handle
    driver.get(url)
    wait_until(lambda: element_shows(driver, "#notes", "pulled by tab B"), "tab B's note")
    driver.switch_to.window(tab_a)
    submit(driver, "#note-form", "stored by tab A")
    wait_until(lambda: element_shows(driver, "#status", "saved"), "tab A's note saved")
    driver.find_element(By.CSS_SELECTOR, "#sync").click()
    wait_until(lambda: element_shows(driver, "#notes", "stored by tab A"), "tab A's own note pulled")
    driver.refresh()
    wait_until(lambda: element_shows(driver, "#notes", "stored by tab A"), "tab A's note after a reload")
    for text in ("pulled by tab B", "kept by the page before"):
        assert element_shows(driver, "#notes", text), f"{text!r} lost: {driver.find_element(By.ID, 'notes').text}"
    driver.switch_to.window(tab_b)
    driver.close()
    driver.switch_to.window(tab_a)
    step("two tabs of the example page keep each other's notes, and an earlier version's")


def guide_page_works(driver):
    """The complete page of docs/web-client.md, as written (served as /guide/), as a person
    uses it: sign in, add a note, see it listed, also after a reload."""
    fay = f"fay-{RUN}@example.com"
    sign_in_on_page(driver, f"{PAGE_ORIGIN}/guide/", "#sign-in", "#code", fay)
    # It reloads once signed in.
    wait_until(lambda: driver.execute_script("return document.readyState === 'complete' &&"
                                             " performance.getEntriesByType('navigation')[0].type === 'reload'"),
               "the guide's page reloaded")
    submit(driver, "#note", "hello from the guide")
    wait_until(lambda: element_shows(driver, "#notes", "hello from the guide"), "the guide's note listed")
    driver.refresh()
    wait_until(lambda: element_shows(driver, "#notes", "hello from the guide"), "the guide's note after a reload")
    assert [e["payload"]["text"] for e in server_events(api_token(fay))] == ["hello from the guide"]
    step("the complete page of the guide signs in, records and lists a note")


def answers_not_the_servers(driver):
    """Answers that are not the server's, or not as it gives them (a proxy set up wrong, a
    captive portal, a cache, a clock that is off), through a proxy of its own: each check in
    ANSWER_CHECKS, one user signed in for all of them."""
    proxy = Proxy()
    open_page(driver, proxy.url, {"autoPush": False, "live": False})
    sign_in(driver, f"hana-{RUN}@example.com")
    for check in ANSWER_CHECKS:
        check(driver, proxy)


def a_page_with_more_must_move_past_the_cursor(driver, proxy):
    """A pull page saying has_more without moving past the cursor: refused, not asked for
    again (forever: each answer the same)."""
    js(driver, "await client.sync(() => {}); return true")
    at = js(driver, CURSOR)
    before = len(proxy.requests("GET", "/sync/v1/events"))
    proxy.add_rule("GET", "/sync/v1/events", 200, {}, {"events": [], "next_after": at, "has_more": True})
    outcome = js(driver, SYNC_OUTCOME)
    assert outcome == "invalid_response", outcome
    assert len(proxy.requests("GET", "/sync/v1/events")) == before + 1, "the same page asked for again"
    assert js(driver, CURSOR) == at
    assert js(driver, SYNC_OUTCOME) == "synced"
    step("a pull page saying has_more without moving past the cursor is refused, not asked for again")


def a_page_in_the_way_signs_nobody_out(driver, proxy):
    """A 400, 401 or 403 page of something in the way answering the token refresh, and a 401
    page answering a call again after a refresh: failures, the session stays (only the
    server's own JSON error ends it)."""
    for status in (400, 401, 403):
        driver.execute_script(EXPIRE)
        proxy.add_rule("POST", "/auth/v1/token", status, *PAGE_IN_THE_WAY)
        outcome = js(driver, SYNC_OUTCOME)
        assert outcome == f"http_{status}", outcome
        assert js(driver, "return client.isSignedIn"), f"signed out by a {status} page"
    # A 401 page answering a call is not the server's refusal of the token: no refresh is
    # spent on it (the leader's push would spend one per retry). A sync first: the token
    # expired above is refreshed.
    assert js(driver, SYNC_OUTCOME) == "synced"
    refreshes = len(proxy.requests("POST", "/auth/v1/token"))
    proxy.add_rule("GET", "/sync/v1/events", 401, *PAGE_IN_THE_WAY)
    outcome = js(driver, SYNC_OUTCOME)
    assert outcome == "http_401", outcome
    assert js(driver, "return client.isSignedIn"), "signed out by a 401 page"
    assert len(proxy.requests("POST", "/auth/v1/token")) == refreshes, "a refresh spent on a 401 page"
    assert js(driver, SYNC_OUTCOME) == "synced"
    step("a 4xx page in the way of a token refresh or a call keeps the session")
    step("a 401 page in the way of a call spends no token refresh")


def an_answer_past_max_answer_bytes_is_not_read(driver, proxy):
    """A pull answered with a body that never ends (chunked), and a push answered with a
    Content-Length past maxAnswerBytes (a proxy gone wrong): cancelled at the limit, unread
    (the proxy never sends it all); the sync fails (invalid_response), the cursor and the
    outbox stay as they were, and the next sync goes through."""
    fails = ("try { await client.sync(() => {}); return 'synced' }"
             " catch (e) { return e.code + ': ' + e.message }")
    js(driver, "client.maxAnswerBytes = 256 * 1024; await client.sync(() => {}); return true")
    at = js(driver, CURSOR)
    proxy.answer_huge("GET", "/sync/v1/events", announced=False)
    outcome = js(driver, fails)
    assert outcome.startswith("invalid_response") and "over 262144 bytes" in outcome, outcome
    wait_until(lambda: proxy.huge_outcome is not None, "the endless answer to end")
    assert proxy.huge_outcome == "cut", "the page read the endless answer on past maxAnswerBytes"
    assert js(driver, CURSOR) == at
    assert js(driver, RECORD, "huge", 1) == 1
    proxy.answer_huge("POST", "/sync/v1/events", announced=True)
    outcome = js(driver, fails)
    assert outcome.startswith("invalid_response") and "over 262144 bytes" in outcome, outcome
    wait_until(lambda: proxy.huge_outcome is not None, "the announced answer to end")
    assert proxy.huge_outcome == "cut", "the page read an answer announced past maxAnswerBytes"
    assert js(driver, "return await client.pendingCount()") == 1
    assert js(driver, SYNC_OUTCOME) == "synced"
    assert js(driver, "return await client.pendingCount()") == 0
    js(driver, "client.maxAnswerBytes = 32 * 1024 * 1024; return true")
    step("an answer past maxAnswerBytes is cancelled unread: the sync fails, the cursor and outbox stay")


def a_retry_after_date_counts_from_the_answers_date(driver, proxy):
    """A 429 dated 2100 (this device's clock, in 2026, 73 years behind) asking to wait until 1 s
    after its Date: waited out (about 1 s), not refused as decades over maxRetryAfter."""
    assert js(driver, RECORD, "dated", 1) == 1
    before = len(proxy.requests("POST", "/sync/v1/events"))
    proxy.add_rule("POST", "/sync/v1/events", 429, {
        "Date": "Fri, 01 Jan 2100 00:00:00 GMT", "Retry-After": "Fri, 01 Jan 2100 00:00:01 GMT",
        "Access-Control-Expose-Headers": "Retry-After, Date"})
    report = js(driver, "const r = await client.sync(); return {...r, pending: await client.pendingCount()}")
    assert report["pushed"] == 1 and report["pending"] == 0, report
    statuses = [entry[3] for entry in proxy.requests("POST", "/sync/v1/events")[before:]]
    assert statuses == [429, 200], statuses
    step("a Retry-After date is counted from the answer's Date, not the device's clock")


def a_long_retry_after_holds_the_leader_back_at_most_max_retry_after(driver, proxy):
    """The leader's stream and background push told to wait a day (a Retry-After over
    maxRetryAfter, as a date counted from a clock that is off can be): each tries again
    after maxRetryAfter (1 s here), not after a day. Leaves a quiet page open."""
    proxy.add_rule("GET", "/sync/v1/stream", 503, {"Retry-After": "86400"})
    open_page(driver, proxy.url, {"retry": {"maxRetryAfter": 1000}})
    wait_until(lambda: js(driver, "return client.isLeader"), "the leader")
    js(driver, "(async () => { for await (const e of client.liveEvents()) window.live.push(e.seq) })(); return true")
    wait_until(lambda: 503 in [entry[3] for entry in proxy.requests("GET", "/sync/v1/stream")], "the stream's 503")
    seq = push(stored_session(driver)["access_token"], "streamed after a day's Retry-After")
    wait_until(lambda: seq in driver.execute_script("return window.live"), "the event live, a day early")
    before = len(proxy.requests("POST", "/sync/v1/events"))
    proxy.add_rule("POST", "/sync/v1/events", 429, {"Retry-After": "86400"})
    assert js(driver, RECORD, "a-day-early", 1) == 1
    wait_until(lambda: js(driver, "return await client.pendingCount()") == 0, "the push, a day early")
    statuses = [entry[3] for entry in proxy.requests("POST", "/sync/v1/events")[before:]]
    assert statuses == [429, 200], statuses
    open_page(driver, proxy.url, {"autoPush": False, "live": False})
    step("a Retry-After over maxRetryAfter holds the leader's stream and push back for maxRetryAfter at most")


def a_400_page_in_the_way_quarantines_nothing(driver, proxy):
    """A push answered with a 400 page of something in the way (not the server's JSON error
    naming events): the push fails, nothing is quarantined, the next push stores the event."""
    assert js(driver, RECORD, "page-400", 1) == 1
    proxy.add_rule("POST", "/sync/v1/events", 400, *PAGE_IN_THE_WAY)
    outcome = js(driver, SYNC_OUTCOME)
    assert outcome == "http_400", outcome
    kept = js(driver, "return [await client.pendingCount(), (await client.quarantinedEvents()).length]")
    assert kept == [1, 0], kept
    report = js(driver, "const r = await client.sync(); return {...r, pending: await client.pendingCount()}")
    assert report["pushed"] == 1 and report["pending"] == 0 and report["rejected"] == [], report
    step("a 400 page in the way of a push quarantines nothing; the events stay in the outbox")


def a_refresh_whose_answer_is_mangled_asks_again_at_once(driver, proxy):
    """The server's answer to a token refresh (the token rotated) replaced on the way by a 200
    page: asked again at once, within the server's reuse interval, the same token gets a
    session; kept, it would revoke the session at the next refresh."""
    driver.execute_script(EXPIRE)
    before = len(proxy.requests("POST", "/auth/v1/token"))
    proxy.mangle("POST", "/auth/v1/token")
    outcome = js(driver, SYNC_OUTCOME)
    assert outcome == "synced", outcome
    assert len(proxy.requests("POST", "/auth/v1/token")) == before + 2
    driver.execute_script(EXPIRE)
    assert js(driver, SYNC_OUTCOME) == "synced"
    assert js(driver, "return client.isSignedIn")
    step("a token refresh whose 200 answer is mangled is asked again at once; the session lives on")


def an_outbox_record_that_cannot_be_sent_is_set_aside(driver, proxy):
    """Outbox records that cannot be sent as events (written by something else than `record`:
    a payload with a BigInt, a record without a client_id) between good ones: the good ones
    are pushed, in order, once each; the others go to the quarantine as they were (field
    `record`), named in `rejected`. (The BigInt failed every push, as a network failure, the
    events after it never sent.)"""
    outcome = js(driver, """
        const first = await client.record('note', {tag: 'unsendable', n: 0});
        const db = await client.current().db();
        await new Promise((resolve, reject) => {
          const tx = db.transaction('outbox', 'readwrite');
          const outbox = tx.objectStore('outbox');
          const at = new Date().toISOString();
          outbox.add({client_id: crypto.randomUUID(), type: 'note', payload: {tag: 'unsendable', big: 1n},
                      client_timestamp: at, bytes: 30});
          outbox.add({type: 'note', payload: {tag: 'unsendable', lost: 'id'}, client_timestamp: at, bytes: 30});
          tx.oncomplete = resolve;
          tx.onerror = () => reject(tx.error);
        });
        const last = await client.record('note', {tag: 'unsendable', n: 1});
        let report;
        try { report = await client.sync() } catch (e) { return {failed: e.code || String(e)} }
        const set = (await client.quarantinedEvents()).filter((e) => e.field === 'record');
        const outcome = {ids: [first, last], pushed: report.pushed, rejected: report.rejected.map((e) => e.field),
          pending: await client.pendingCount(),
          kept: set.map((e) => [typeof e.payload.big, e.payload.lost ?? null, e.client_id.startsWith('unreadable-')]),
          named: report.rejected.map((e) => e.client_id).sort().join() === set.map((e) => e.client_id).sort().join()};
        await client.discardQuarantined(set.map((e) => e.client_id));
        return outcome;
    """)
    assert "failed" not in outcome, outcome
    assert outcome["pushed"] == 2 and outcome["pending"] == 0, outcome
    assert outcome["rejected"] == ["record", "record"] and outcome["named"], outcome
    assert sorted(outcome["kept"], key=str) == sorted([["bigint", None, False], ["undefined", "id", True]], key=str), \
        outcome
    stored = tagged(server_events(stored_session(driver)["access_token"]), "unsendable")
    assert [event["client_id"] for event in stored] == outcome["ids"], stored
    step("outbox records that cannot be sent go to the quarantine as they were; the others are pushed, in order")


def a_cursor_or_quarantine_entry_it_cannot_read_blocks_nothing(driver, proxy):
    """A stored cursor that is not a seq and a quarantine entry without its time (written by
    something else): the sync pulls from the beginning and stores a cursor again, and the
    quarantine is listed. (Every sync asked the server for that cursor, refused; every
    `quarantinedEvents()` threw.)"""
    outcome = js(driver, """
        const db = await client.current().db();
        await new Promise((resolve, reject) => {
          const tx = db.transaction(['meta', 'quarantine'], 'readwrite');
          tx.objectStore('meta').put('not a seq', 'cursor');
          tx.objectStore('quarantine').put({client_id: 'odd-entry', type: 'note', payload: {}});
          tx.objectStore('quarantine').put({client_id: 'dated-entry', type: 'note', payload: {}, field: '',
                                            reason: 'x', quarantined_at: new Date().toISOString()});
          tx.oncomplete = resolve;
          tx.onerror = () => reject(tx.error);
        });
        let pulled = 0;
        try { await client.sync((events) => { pulled += events.length }) } catch (e) { return {failed: e.code || String(e)} }
        let listed;
        try { listed = (await client.quarantinedEvents()).map((e) => e.client_id) } catch (e) { return {failed: String(e)} }
        await client.discardQuarantined(['odd-entry', 'dated-entry']);
        const r = db.transaction('meta').objectStore('meta').get('cursor');
        const cursor = await new Promise((resolve) => { r.onsuccess = () => resolve(r.result) });
        return {pulled, listed, cursor};
    """)
    assert "failed" not in outcome, outcome
    assert outcome["pulled"] > 0 and isinstance(outcome["cursor"], int) and outcome["cursor"] > 0, outcome
    assert outcome["listed"] == ["odd-entry", "dated-entry"], outcome
    step("a stored cursor or a quarantine entry it cannot read blocks no sync: pulled again from the start")


# Base64 of random bytes: nothing to compress, so a value of it stays over Chrome's wrapping
# threshold, in a file of its own (see large_value_files).
RANDOM_TEXT = """
    const random = (length) => {
      const bytes = crypto.getRandomValues(new Uint8Array(length));
      let text = '';
      for (let i = 0; i < bytes.length; i += 8192) text += String.fromCharCode(...bytes.subarray(i, i + 8192));
      return btoa(text).slice(0, length);
    };
"""


def large_value_files(profile):
    """The files Chromium keeps large IndexedDB values in under `profile`, in the order written."""
    return sorted((path for path in glob.glob(os.path.join(profile, "Default", "IndexedDB", "*.indexeddb.blob", "**"),
                                              recursive=True) if os.path.isfile(path)),
                  key=lambda path: int(os.path.basename(path), 16))


def a_record_the_browser_cannot_read_blocks_nothing(proxy):
    """Records whose value the browser cannot read any more: Chrome keeps a value over its
    wrapping threshold (~64 KiB: an event near the payload limit) in a file of its own under
    the profile's `*.indexeddb.blob` directory. That file deleted or damaged while the browser
    was closed (a disk clean-up, a profile copied without it), reading the record fails
    (`NotReadableError`, `UnknownError`), and so did every push's read of the outbox head, as
    a whole: no event recorded after it ever reached the server. Now the events around it are
    pushed, in order; it is replaced in the quarantine by an entry naming its outbox key and
    the browser's error, told once in `rejected`; the next sync is clean. A quarantine entry
    in the same state is listed as such (`quarantinedEvents()` failed for good), left by
    `requeueQuarantined` (the others requeued) and dropped by `discardQuarantined`. In a
    browser of its own, on a profile directory the test owns, closed to damage the files."""
    profile = tempfile.mkdtemp(prefix="trunk-sync-profile-")
    address = f"ivy-{RUN}@example.com"
    driver = browser(profile)
    try:
        open_page(driver, proxy.url, {"autoPush": False, "live": False})
        sign_in(driver, address)
        recorded = js(driver, RANDOM_TEXT + """
            const ids = [];
            for (let n = 0; n < 3; n++) ids.push(await client.record('note', {tag: 'blob', n}));
            // 64 KiB of JSON, the most `record` takes (the server's limit as stored is the same).
            const large = await client.record('note', {tag: 'blob', n: 'large', text: random(64 * 1024 - 40)});
            for (let n = 3; n < 6; n++) ids.push(await client.record('note', {tag: 'blob', n}));
            // Two events the server refused, in the quarantine: one as large, one small.
            const requeued = crypto.randomUUID();
            const db = await client.current().db();
            await new Promise((resolve, reject) => {
              const tx = db.transaction('quarantine', 'readwrite');
              const at = new Date().toISOString();
              tx.objectStore('quarantine').put({client_id: 'large-refused', type: 'note', payload: {text: random(64 * 1024)},
                client_timestamp: at, field: 'payload', reason: 'x', quarantined_at: at});
              tx.objectStore('quarantine').put({client_id: requeued, type: 'note', payload: {tag: 'blob', n: 'requeued'},
                client_timestamp: at, field: 'payload', reason: 'x', quarantined_at: at});
              tx.oncomplete = resolve;
              tx.onerror = () => reject(tx.error);
            });
            const keys = db.transaction('outbox').objectStore('outbox').getAllKeys();
            const outboxKeys = await new Promise((resolve) => { keys.onsuccess = () => resolve(keys.result) });
            return {ids, large, requeued, largeKey: outboxKeys[3], pending: await client.pendingCount()};
        """)
        assert recorded["pending"] == 7, recorded
    finally:
        driver.quit()
    # The large values' files (numbered in the order written: the outbox's, the quarantine's):
    # the first deleted, the second cut short.
    files = large_value_files(profile)
    assert len(files) == 2, f"Chromium kept the large values inline, not in files: {files}"
    os.remove(files[0])
    with open(files[1], "r+b") as file:
        file.truncate(1000)
    driver = browser(profile)
    try:
        open_page(driver, proxy.url, {"autoPush": False, "live": False})
        assert js(driver, "return client.isSignedIn")
        outcome = js(driver, """
            const [lost, requeued] = args;
            const sync = async () => { try { return await client.sync() } catch (e) { return {failed: String(e.name || e.code) + ': ' + e.message} } };
            const first = await sync();
            if (first.failed) return {first};
            const second = await sync();
            const listed = await client.quarantinedEvents();
            const pending = await client.pendingCount();
            await client.requeueQuarantined(['large-refused', requeued, lost]);
            const left = (await client.quarantinedEvents()).map((e) => e.client_id).sort();
            const requeuedPending = await client.pendingCount();
            await client.discardQuarantined(['large-refused', lost]);
            const third = await sync();
            return {first, second, listed, pending, left, requeuedPending, third,
                    emptied: (await client.quarantinedEvents()).length};
        """, f"unreadable-{recorded['largeKey']}", recorded["requeued"])
        assert "failed" not in outcome["first"], outcome
        first, lost = outcome["first"], f"unreadable-{recorded['largeKey']}"
        assert first["pushed"] == 6 and [e["client_id"] for e in first["rejected"]] == [lost], first
        assert first["rejected"][0]["field"] == "unreadable", first
        assert re.search(r"outbox record \d+ \((NotReadableError|UnknownError|DataError): ", first["rejected"][0]["reason"]), first
        assert outcome["second"] == {"pushed": 0, "duplicates": 0, "rejected": [], "pulled": 0}, outcome
        assert outcome["pending"] == 0, outcome
        listed = {entry["client_id"]: entry for entry in outcome["listed"]}
        assert sorted(listed) == sorted([lost, "large-refused", recorded["requeued"]]), listed
        assert listed[lost]["outbox_key"] == recorded["largeKey"] and listed[lost]["field"] == "unreadable", listed
        assert listed["large-refused"]["field"] == "unreadable", listed
        assert "quarantine entry" in listed["large-refused"]["reason"], listed
        assert listed[recorded["requeued"]]["field"] == "payload", listed
        assert outcome["left"] == sorted(["large-refused", lost]) and outcome["requeuedPending"] == 1, outcome
        assert outcome["third"]["pushed"] == 1 and outcome["emptied"] == 0, outcome
        stored = tagged(server_events(stored_session(driver)["access_token"]), "blob")
        assert [event["client_id"] for event in stored] == recorded["ids"] + [recorded["requeued"]], stored
        assert [event["payload"]["n"] for event in stored] == [0, 1, 2, 3, 4, 5, "requeued"], stored
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
    step("an outbox record the browser cannot read (its large value's file lost) is set aside, told once;"
         " the others are pushed, in order")


def a_record_that_fails_to_read_for_a_while_is_kept(proxy):
    """An outbox record whose large value's file is cut short fails its reads with
    `UnknownError`, what Chrome reports for its internal, "likely transient", failures (a
    file locked for a moment, say by a virus scanner just after it was written): no push may
    drop it for that. The push fails with it, as before, every event kept in the outbox;
    only once it failed in a later push too, `unreadableGrace` after (10 minutes; 0 here),
    is it set aside, told once, and the others pushed, in order. A record before it whose
    file is gone is set aside at once, by the push that then fails: told all the same, in
    `'rejected'`."""
    profile = tempfile.mkdtemp(prefix="trunk-sync-profile-")
    driver = browser(profile)
    try:
        open_page(driver, proxy.url, {"autoPush": False, "live": False})
        sign_in(driver, f"jay-{RUN}@example.com")
        recorded = js(driver, RANDOM_TEXT + """
            const ids = [await client.record('note', {tag: 'damaged', n: 0})];
            await client.record('note', {tag: 'damaged', n: 'gone', text: random(64 * 1024 - 40)});
            await client.record('note', {tag: 'damaged', n: 'large', text: random(64 * 1024 - 40)});
            ids.push(await client.record('note', {tag: 'damaged', n: 1}));
            const db = await client.current().db();
            const keys = db.transaction('outbox').objectStore('outbox').getAllKeys();
            const outboxKeys = await new Promise((resolve) => { keys.onsuccess = () => resolve(keys.result) });
            return {ids, goneKey: outboxKeys[1], largeKey: outboxKeys[2], pending: await client.pendingCount()};
        """)
        assert recorded["pending"] == 4, recorded
    finally:
        driver.quit()
    files = large_value_files(profile)
    assert len(files) == 2, f"Chromium kept the large values inline, not in files: {files}"
    os.remove(files[0])
    with open(files[1], "r+b") as file:
        file.truncate(1000)
    driver = browser(profile)
    try:
        open_page(driver, proxy.url, {"autoPush": False, "live": False})
        outcome = js(driver, """
            const sync = async () => { try { return await client.sync() } catch (e) { return {failed: String(e.name || e.code)} } };
            const told = [];
            client.onStateChange((state, detail) => { if (state === 'rejected') told.push(detail.map((e) => e.client_id)) });
            const first = await sync();
            const second = await sync();
            const kept = {pending: await client.pendingCount(), quarantined: (await client.quarantinedEvents()).length};
            client.unreadableGrace = 0;
            const third = await sync();
            const fourth = await sync();
            return {first, second, kept, told, third, fourth, pending: await client.pendingCount()};
        """)
        lost = f"unreadable-{recorded['largeKey']}"
        assert outcome["first"] == {"failed": "UnknownError"} == outcome["second"], outcome
        # The record whose file is gone left at once, told by the push that failed then.
        assert outcome["told"] == [[f"unreadable-{recorded['goneKey']}"]], outcome
        assert outcome["kept"] == {"pending": 3, "quarantined": 1}, outcome
        third = outcome["third"]
        assert third["pushed"] == 2 and [(e["client_id"], e["field"]) for e in third["rejected"]] == [(lost, "unreadable")], outcome
        assert outcome["fourth"] == {"pushed": 0, "duplicates": 0, "rejected": [], "pulled": 0}, outcome
        assert outcome["pending"] == 0, outcome
        stored = tagged(server_events(stored_session(driver)["access_token"]), "damaged")
        assert [event["client_id"] for event in stored] == recorded["ids"], stored
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
    step("an outbox record whose reads fail for a while (its large value's file cut short) is kept until it failed"
         " in a later push too, then set aside")


def live_leader(driver, proxy):
    """Opens a leader page on `proxy` whose live stream is open, its events going to
    `window.live` and what `onStateChange` tells (with the error's code) to `window.states`."""
    open_page(driver, proxy.url, {"retry": {"maxDelay": 1000}})
    js(driver, "window.states = []; client.onStateChange((state, detail) =>"
               " window.states.push([state, detail && detail.code || null])); return true")
    wait_until(lambda: js(driver, "return client.isLeader"), "the leader")
    js(driver, "(async () => { for await (const e of client.liveEvents()) window.live.push(e.seq) })(); return true")
    wait_until(lambda: len(proxy.streams) > 0, "the live stream open")


def a_stream_message_it_cannot_read_loses_no_event(driver, proxy):
    """A live stream message cut short on the way, in the same piece as an event before it:
    that event is delivered, the app is told ('live_failed'), and the stream, reopened after
    it, brings the next. (The event was not delivered, and the stream reopened past it.)
    Leaves a quiet page open."""
    live_leader(driver, proxy)
    token = stored_session(driver)["access_token"]
    proxy.poison_stream = True
    first = push(token, "streamed before a message cut short")
    wait_until(lambda: not proxy.poison_stream, "the message cut short")
    second = push(token, "streamed after it")
    wait_until(lambda: second in driver.execute_script("return window.live"), "the event after it")
    live = driver.execute_script("return window.live")
    assert live == [first, second], live
    states = driver.execute_script("return window.states")
    assert ["live_failed", "invalid_response"] in states, states
    open_page(driver, proxy.url, {"autoPush": False, "live": False})
    step("a live stream message cut short loses no event: the one before it delivered, the app told")


def a_stream_line_that_never_ends_holds_nothing(driver, proxy):
    """A live stream answer whose one line never ends, each piece in time for the watchdog:
    dropped once it runs past what any event takes, and reopened; the next event arrives.
    (It held the stream, and grew, for as long as the bytes came.) Leaves a quiet page open."""
    live_leader(driver, proxy)
    proxy.fake_stream = "endless"
    proxy.cut()
    wait_until(lambda: proxy.fake_stream is None, "the endless stream answered")
    seq = push(stored_session(driver)["access_token"], "streamed after an endless line")
    wait_until(lambda: seq in driver.execute_script("return window.live"), "the event after the endless line",
               timeout=30)
    assert ["live_failed", "invalid_response"] in driver.execute_script("return window.states")
    open_page(driver, proxy.url, {"autoPush": False, "live": False})
    step("a live stream line that never ends is dropped and reopened; the next event arrives")


ANSWER_CHECKS = [a_page_with_more_must_move_past_the_cursor, a_page_in_the_way_signs_nobody_out,
                 an_answer_past_max_answer_bytes_is_not_read,
                 a_retry_after_date_counts_from_the_answers_date, a_400_page_in_the_way_quarantines_nothing,
                 a_refresh_whose_answer_is_mangled_asks_again_at_once,
                 an_outbox_record_that_cannot_be_sent_is_set_aside,
                 a_cursor_or_quarantine_entry_it_cannot_read_blocks_nothing,
                 a_stream_message_it_cannot_read_loses_no_event,
                 a_stream_line_that_never_ends_holds_nothing,
                 a_long_retry_after_holds_the_leader_back_at_most_max_retry_after]


def offline(driver, on):
    """DevTools' network emulation for the current tab (it needs Network.enable first)."""
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.emulateNetworkConditions",
                           {"offline": on, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1})


def crash(driver):
    """Kills the current tab's renderer (Page.crash), as a killed tab dies mid-work; the
    driver is then on a new blank tab (a crashed tab takes no more commands)."""
    victim = driver.current_window_handle
    driver.switch_to.new_window("tab")
    spare = driver.current_window_handle
    driver.switch_to.window(victim)
    try:
        driver.execute_cdp_cmd("Page.crash", {})
    except Exception:  # the answer never comes from a crashed tab
        pass
    driver.switch_to.window(spare)


if __name__ == "__main__":
    main()
