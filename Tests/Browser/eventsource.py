"""A browser's EventSource against trunk-sync's event stream, from a page on another origin.

Usage: eventsource.py API_URL PAGE_PORT ACCESS_TOKEN

Serves a small page on http://127.0.0.1:PAGE_PORT (another origin than API_URL), opens it in
headless Chromium (Debian's chromium and chromium-driver, through selenium), and the page
opens `new EventSource(API_URL/sync/v1/stream?after=0&access_token=…)`. Two events are pushed
before the page opens (the backlog) and two after it is connected (live). Prints one JSON
object: the ids and payloads the page received, and its connection state. Exits non-zero
when the events do not arrive in time.
"""
import http.server
import json
import sys
import threading
import time
import urllib.request
import uuid

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service

api, page_port, token = sys.argv[1], int(sys.argv[2]), sys.argv[3]

PAGE = """<!doctype html>
<meta charset="utf-8">
<title>stream</title>
<script>
  window.received = [];
  window.opened = false;
  window.errors = 0;
  const source = new EventSource(%s);
  source.onopen = () => { window.opened = true; };
  source.onerror = () => { window.errors += 1; };
  source.addEventListener("event", (message) => {
    const event = JSON.parse(message.data);
    window.received.push({id: message.lastEventId, seq: event.seq, payload: event.payload});
  });
</script>
"""


class Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        url = f"{api}/sync/v1/stream?after=0&access_token={token}"
        body = (PAGE % json.dumps(url)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def push(n):
    events = [{"client_id": str(uuid.uuid4()), "type": "note", "payload": {"n": n},
               "client_timestamp": "2026-11-22T04:10:02.123Z"}]
    request = urllib.request.Request(
        f"{api}/sync/v1/events", data=json.dumps({"events": events}).encode(), method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200, response.status


def wait_for(driver, script, timeout=15):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if driver.execute_script(script):
            return True
        time.sleep(0.05)
    return False


server = http.server.ThreadingHTTPServer(("127.0.0.1", page_port), Page)
threading.Thread(target=server.serve_forever, daemon=True).start()
options = Options()
options.binary_location = "/usr/bin/chromium"
for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
    options.add_argument(argument)
driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
try:
    push(1)
    push(2)
    driver.get(f"http://127.0.0.1:{page_port}/")
    backlog = wait_for(driver, "return window.received.length >= 2")
    push(3)
    push(4)
    live = wait_for(driver, "return window.received.length >= 4")
    result = driver.execute_script(
        "return {received: window.received, opened: window.opened, errors: window.errors}")
    print(json.dumps({"backlog": backlog, "live": live, **result}), flush=True)
    sys.exit(0 if backlog and live else 1)
finally:
    driver.quit()
    server.shutdown()
