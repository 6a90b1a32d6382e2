"""Supabase's own Realtime client (the `realtime` package supabase-py uses) against trunk-sync.

Usage: realtime_flow.py BASE_URL OTHER_BASE_URL SESSION_A SESSION_B
BASE_URL is the instance the client subscribes on, OTHER_BASE_URL another instance on the
same database (inserts go through it). SESSION_A / SESSION_B are `trunk-sync token` outputs
(JSON) of two users. Prints one "ok <step>" line per step and exits non-zero on a failure.

In the middle it prints "restart now" and waits for a line on stdin: the test restarts the
subscribed instance meanwhile, and the client must re-subscribe on its own.
"""
import asyncio
import json
import sys
import time
import urllib.request

from realtime import AsyncRealtimeClient, RealtimeAcknowledgementStatus, RealtimeSubscribeStates
from realtime_support import WAIT, insert, step, user_of

base_url, other_url = sys.argv[1], sys.argv[2]
session_a, session_b = json.loads(sys.argv[3]), json.loads(sys.argv[4])


def http(method, url, token=None, body=None):
    headers = {"Content-Type": "application/json", "apikey": "anon-key"}
    if token:
        headers["Authorization"] = "Bearer " + token
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
        return json.loads(text) if text else None



class Subscriber:
    """One client with one channel: `events` INSERT for the user, `*` with a type filter, and
    `*` on every table of the schema (no table named: events and profiles)."""

    def __init__(self, name, session, filter_user):
        self.name = name
        self.token = session["access_token"]
        self.client = AsyncRealtimeClient(base_url + "/realtime/v1", "anon-key", initial_backoff=0.2, max_retries=30)
        self.all = asyncio.Queue()
        self.notes = asyncio.Queue()
        self.everything = asyncio.Queue()
        self.states = asyncio.Queue()
        self.filter_user = filter_user

    async def subscribe(self, signed_in=True):
        """Joins; not `signed_in`, with the app's key (the client's access_token until
        set_auth), as an app does before its user signs in."""
        await self.client.connect()
        if signed_in:
            await self.client.set_auth(self.token)
        self.channel = self.client.channel("events-" + self.name)
        self.channel.on_postgres_changes(
            "INSERT", schema="public", table="events", filter=f"user_id=eq.{self.filter_user}",
            callback=lambda payload: self.all.put_nowait(payload))
        self.channel.on_postgres_changes(
            "*", schema="public", table="events", filter="type=in.(note,memo)",
            callback=lambda payload: self.notes.put_nowait(payload))
        self.channel.on_postgres_changes(
            "*", schema="public", callback=lambda payload: self.everything.put_nowait(payload))
        await self.channel.subscribe(lambda state, error: self.states.put_nowait((state, error)))
        await self.wait_subscribed()

    async def wait_subscribed(self, reconnecting=False):
        """Until SUBSCRIBED; a CHANNEL_ERROR is a failure unless the connection was lost."""
        while True:
            state, error = await asyncio.wait_for(self.states.get(), WAIT * 3)
            print(f"  {self.name}: {state.value} {error or ''}", flush=True)
            if state == RealtimeSubscribeStates.SUBSCRIBED:
                return
            if state == RealtimeSubscribeStates.CHANNEL_ERROR and not reconnecting:
                raise SystemExit(f"{self.name}: channel error {error}")


async def handled(subscriber):
    """Until the server has handled what the client sent before: a push it answers in order
    (access_token null, which changes nothing)."""
    done = asyncio.get_running_loop().create_future()
    push = await subscriber.channel.push("access_token", {"access_token": None})
    push.receive(RealtimeAcknowledgementStatus.Ok, lambda _: done.done() or done.set_result(True))
    await asyncio.wait_for(done, WAIT)


async def expect(queue, seq, what):
    started = time.monotonic()
    while True:
        payload = await asyncio.wait_for(queue.get(), WAIT)
        record = payload["data"]["record"]
        if record["seq"] == seq:
            print(f"  {what}: {1000 * (time.monotonic() - started):.0f} ms", flush=True)
            return payload


async def main():
    user_a = user_of(session_a["access_token"])
    a = Subscriber("a", session_a, user_a)
    # B subscribes with a filter naming A's rows: row scoping must still give it nothing of A's.
    b = Subscriber("b", session_b, user_a)
    await a.subscribe()
    await b.subscribe()
    step("subscribe (SUBSCRIBED with postgres_changes bindings matched by position)")

    # Before sign-in the client joins with the app's key: SUBSCRIBED, as on Supabase (which
    # reads as the anon role). It gets no row until set_auth gives it the user's token, then
    # the user's rows, none committed before (nothing is replayed). A tells when a row was
    # fanned out on this instance.
    early = Subscriber("early", session_a, user_a)
    await early.subscribe(signed_in=False)
    before = insert(other_url, session_a["access_token"])
    await expect(a.all, before["seq"], "A's row while the early client is signed out")
    await early.client.set_auth(early.token)
    await handled(early)
    row = insert(other_url, session_a["access_token"])
    seen = []
    while not seen or seen[-1] != row["seq"]:
        seen.append((await asyncio.wait_for(early.all.get(), WAIT))["data"]["record"]["seq"])
    assert seen == [row["seq"]], f"rows before sign-in reached the early client: {seen} (before: {before['seq']})"
    assert early.states.empty(), f"the early channel changed state: {early.states.get_nowait()}"
    await early.client.close()
    step("subscribes before sign-in: SUBSCRIBED, no row until set_auth, then the user's rows")

    row = insert(other_url, session_a["access_token"])
    payload = await expect(a.all, row["seq"], "insert through another instance")
    data = payload["data"]
    assert data["type"] == "INSERT" and data["schema"] == "public" and data["table"] == "events", data
    rest = http("GET", base_url + f"/rest/v1/events?seq=eq.{row['seq']}", session_a["access_token"])
    assert data["record"] == rest[0] == row, (data["record"], rest)
    assert {c["name"] for c in data["columns"]} == set(row), data["columns"]
    await expect(a.notes, row["seq"], "the type filter's binding")
    step("insert through another instance arrives, record as /rest/v1/events returns it")

    # A binding without a table follows every table served: A's profile change reaches it.
    everything = await expect(a.everything, row["seq"], "the binding of every table")
    assert everything["data"]["table"] == "events", everything
    http("PUT", base_url + "/auth/v1/user", session_a["access_token"], {"data": {"full_name": "Ada Everything"}})
    while True:
        payload = await asyncio.wait_for(a.everything.get(), WAIT)
        if payload["data"]["table"] == "profiles":
            break
    data = payload["data"]
    assert data["type"] == "UPDATE" and data["record"]["id"] == user_a, data
    assert data["record"]["full_name"] == "Ada Everything", data
    step("a binding without a table gets events and profile changes")

    other = insert(base_url, session_a["access_token"], kind="sprout")
    await expect(a.all, other["seq"], "unfiltered binding")
    note = insert(base_url, session_a["access_token"], kind="memo")
    await expect(a.notes, note["seq"], "in filter")
    assert all(p["data"]["record"]["type"] in ("note", "memo") for p in list(a.notes._queue)), "filter leaked"
    step("filters: eq on user_id, in on type")

    # A fresh token from the refresh grant: the channel goes on with it.
    refreshed = http(
        "POST", base_url + "/auth/v1/token?grant_type=refresh_token", None,
        {"refresh_token": session_a["refresh_token"]})
    a.token = refreshed["access_token"]
    await a.client.set_auth(a.token)
    row = insert(other_url, a.token)
    await expect(a.all, row["seq"], "after the token refresh")
    step("access_token refresh keeps the channel")

    # Signed out, the clients send the app's key (supabase-py on SIGNED_OUT, supabase-js and
    # supabase-swift too), or null (an accessToken callback without a token). As on Supabase,
    # neither ends the channel: null changes nothing, and the key withholds the user's rows
    # until a token of the user comes back. A second subscriber of A (on the same instance,
    # so the same hub) tells when a row has been fanned out.
    witness = Subscriber("w", session_a, user_a)
    await witness.subscribe()
    await a.client.set_auth(None)
    await handled(a)
    row = insert(other_url, a.token)
    await expect(a.all, row["seq"], "after set_auth(None)")
    await a.client.set_auth("anon-key")
    await handled(a)
    withheld = insert(other_url, a.token)
    await expect(witness.all, withheld["seq"], "the witness, while A is on the key")
    await a.client.set_auth(a.token)
    row = insert(other_url, a.token)
    seen = []
    while not seen or seen[-1] != row["seq"]:
        seen.append((await asyncio.wait_for(a.all.get(), WAIT))["data"]["record"]["seq"])
    assert withheld["seq"] not in seen, f"a row went to the channel while it was on the app's key: {seen}"
    assert a.states.empty(), f"the channel changed state: {a.states.get_nowait()}"
    await witness.client.close()
    step("set_auth(None) changes nothing, set_auth(key) withholds rows and keeps the channel")

    # The connection drops under the client: it reconnects and rejoins by itself.
    await a.client._ws_connection.close(code=4000)
    await a.wait_subscribed(reconnecting=True)
    row = insert(other_url, a.token)
    await expect(a.all, row["seq"], "after a dropped connection")
    step("re-subscribes after a dropped connection")

    print("restart now", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    await a.wait_subscribed(reconnecting=True)
    row = insert(other_url, a.token)
    await expect(a.all, row["seq"], "after a server restart")
    step("re-subscribes after a server restart")

    assert b.all.empty() and b.notes.empty() and b.everything.empty(), "B received A's rows or profile"
    own = insert(other_url, session_b["access_token"], kind="note")
    payload = await expect(b.notes, own["seq"], "B's own row")
    assert payload["data"]["record"]["user_id"] == user_of(session_b["access_token"])
    assert b.all.empty(), "B's user_id=eq.A binding matched B's row"
    step("never another user's row")

    # Signing out ends the channel: a system error (CHANNEL_ERROR), then phx_close (CLOSED).
    started = time.monotonic()
    http("POST", base_url + "/auth/v1/logout", a.token)
    seen = []
    while RealtimeSubscribeStates.CLOSED not in seen:
        state, error = await asyncio.wait_for(a.states.get(), WAIT)
        seen.append(state)
    print(f"  sign-out ended the channel: {1000 * (time.monotonic() - started):.0f} ms", flush=True)
    assert RealtimeSubscribeStates.CHANNEL_ERROR in seen, seen
    step("sign-out ends the channel")

    await a.client.close()
    await b.client.close()


asyncio.run(main())
