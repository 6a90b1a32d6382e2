"""What the Realtime test scripts (realtime_flow.py, realtime_protocol.py) share."""
import base64
import faulthandler
import json
import urllib.request
import uuid

# Generous: the machine running the tests is shared and loaded. Latencies are printed.
WAIT = 10.0
# Never hang the test run: show where it stands and exit after 3 minutes.
faulthandler.dump_traceback_later(180, exit=True)


def step(name):
    print("ok", name, flush=True)


def user_of(token):
    body = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))["sub"]


def insert(base_url, token, kind="note", payload=None, count=None):
    """Inserts one event (or `count` in one request) through /rest/v1/events; the first row."""
    def one():
        return {"user_id": user_of(token), "type": kind, "payload": payload if payload is not None else {"n": 1},
                "client_id": str(uuid.uuid4()), "client_timestamp": "2026-11-22T04:10:02.123Z"}
    body = [one() for _ in range(count)] if count else one()
    request = urllib.request.Request(
        base_url + "/rest/v1/events", data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json", "apikey": "anon-key", "Authorization": "Bearer " + token,
                 "Prefer": "return=representation"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read().decode())[0]
