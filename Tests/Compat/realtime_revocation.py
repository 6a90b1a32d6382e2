"""Every way a session ends stops its Realtime channels at once, also a channel that follows
another session's token, swapped in with `access_token`.

Usage: realtime_revocation.py BASE_URL SESSION_C1 SESSION_C2 SESSION_D
SESSION_C1 / SESSION_C2 are `trunk-sync token` outputs (JSON) of two sessions of one user,
SESSION_D one of another user. With D's channel joined and C's refresh token rotated twice it
prints "age and delete now" and waits for a line on stdin: meanwhile the test deletes D's
account (`trunk-sync users delete`) and ages the rotations past the 10 s in which a rotated
refresh token may be presented again without revoking its session. The server runs
with TRUNK_SYNC_API_KEY=anon-key. Prints one "ok <step>" line per step; exits non-zero on a
failure. How long each end took is printed, not asserted (the machine is shared).
"""
import asyncio
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import websockets
from realtime_support import WAIT, insert, step

base_url = sys.argv[1]
session_c1, session_c2, session_d = (json.loads(argument) for argument in sys.argv[2:5])
parsed = urllib.parse.urlparse(base_url)
url = f"ws://{parsed.hostname}:{parsed.port}/realtime/v1/websocket?apikey=anon-key&vsn=2.0.0"
EVENTS = [{"event": "INSERT", "schema": "public", "table": "events"}]


def auth(path, body=None, token=None):
    """POST /auth/v1/<path>; the JSON answer (None when empty)."""
    headers = {"Content-Type": "application/json", "apikey": "anon-key"}
    if token:
        headers["Authorization"] = "Bearer " + token
    request = urllib.request.Request(
        base_url + "/auth/v1/" + path, data=json.dumps(body or {}).encode(), method="POST", headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
        return json.loads(text) if text else None


async def recv(ws):
    return json.loads(await asyncio.wait_for(ws.recv(), WAIT))


async def join(ws, ref, topic, token):
    payload = {"config": {"broadcast": {"ack": False, "self": False}, "presence": {"key": "", "enabled": False},
                          "postgres_changes": EVENTS, "private": False}, "access_token": token}
    await ws.send(json.dumps([ref, ref, topic, "phx_join", payload]))
    reply = await recv(ws)
    assert reply[1:4] == [ref, topic, "phx_reply"] and reply[4]["status"] == "ok", reply
    assert (await recv(ws))[3] == "system"


async def ended(ws, topic, since, what):
    """The channel is ended: a system error, then phx_close."""
    system = await recv(ws)
    assert system[2:4] == [topic, "system"] and system[4]["status"] == "error", system
    closed = await recv(ws)
    assert closed[2:4] == [topic, "phx_close"], closed
    print(f"  {what}: channel ended {1000 * (time.monotonic() - since):.0f} ms after", flush=True)


async def main():
    async with websockets.connect(url) as ws:
        # Joined with session 1, then following session 2's token (another sign-in of the user).
        await join(ws, "1", "realtime:c", session_c1["access_token"])
        await ws.send(json.dumps(["1", "2", "realtime:c", "access_token", {"access_token": session_c2["access_token"]}]))
        swapped = await recv(ws)
        assert swapped[1] == "2" and swapped[4]["status"] == "ok", swapped
        auth("logout?scope=local", token=session_c1["access_token"])
        row = insert(base_url, session_c2["access_token"])
        change = await recv(ws)
        assert change[3] == "postgres_changes" and change[4]["data"]["record"]["seq"] == row["seq"], change
        step("a channel follows the session of the token swapped in: the first one signed out, it goes on")

        # Session 2's refresh token exchanged, and its successor used.
        first = auth("token?grant_type=refresh_token", {"refresh_token": session_c2["refresh_token"]})
        auth("token?grant_type=refresh_token", {"refresh_token": first["refresh_token"]})

        async with websockets.connect(url) as other:
            await join(other, "1", "realtime:d", session_d["access_token"])
            print("age and delete now", flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
            await ended(other, "realtime:d", time.monotonic(), "trunk-sync users delete")
            step("trunk-sync users delete ends the account's channels")

        # The first refresh token presented again, later than 10 s after its rotation and
        # after its successor was used (a stolen token replayed): the session is revoked, and
        # the channel that follows it by access_token ends.
        since = time.monotonic()
        try:
            auth("token?grant_type=refresh_token", {"refresh_token": session_c2["refresh_token"]})
            raise SystemExit("a refresh token replayed after its successor was used was accepted")
        except urllib.error.HTTPError as refused:
            assert refused.code in (400, 401), refused.code
        await ended(ws, "realtime:c", since, "refresh token reuse")
        step("refresh token reuse ends the channel that follows the session by access_token")


asyncio.run(main())
