"""trunk-sync's WebSocket layer and Realtime protocol, held to the clients' shapes.

Usage: realtime_protocol.py BASE_URL SESSION_A SESSION_B JWT_SECRET
SESSION_A / SESSION_B are `trunk-sync token` outputs (JSON) of two users; the server runs
with TRUNK_SYNC_API_KEY=anon-key, TRUNK_SYNC_REALTIME_BUFFER=4096 and
TRUNK_SYNC_REALTIME_MAX_CHANNELS_PER_USER=3, TRUNK_SYNC_REALTIME_MAX_FILTER_BYTES=1024, and
signs with JWT_SECRET (HS256), with which
A's token is signed again with other expiries.

- Raw sockets: the handshake, and the edge cases of RFC 6455 (unmasked frame -> 1002,
  oversized -> 1009, fragmented or oversized control frame -> 1002, reserved bits, unknown
  opcode, stray continuation or bad close code -> 1002, bad UTF-8 -> 1007, UTF-8 split
  across fragments is fine, ping/pong, the close handshake, a half-open connection, a slow
  reader -> 1013).
- Python's `websockets` as an independent client, speaking vsn 2.0.0 JSON arrays exactly as
  supabase-js's realtime-js does (its serializer and join payload), and vsn 1.0.0 JSON
  objects as supabase-swift's Realtime does (RealtimeMessageV2: join_ref, ref, topic,
  event, payload, the payload always an object, binding ids integers).
At the end it prints "stop now" and waits for a line on stdin: the test sends SIGTERM, and
an open socket must get close 1001.
Prints one "ok <step>" line per step; exits non-zero on a failure.
"""
import asyncio
import base64
import hashlib
import json
import os
import socket
import struct
import sys
import time
import urllib.parse
import urllib.request
import uuid

import jwt
import websockets
from realtime_support import WAIT, insert as insert_at, step, user_of

base_url = sys.argv[1]
session_a, session_b = json.loads(sys.argv[2]), json.loads(sys.argv[3])
jwt_secret = sys.argv[4]
parsed = urllib.parse.urlparse(base_url)
HOST, PORT = parsed.hostname, parsed.port
PATH = "/realtime/v1/websocket?apikey=anon-key&vsn=2.0.0"



def insert(token, **options):
    return insert_at(base_url, token, **options)


def expiring(token, seconds):
    """`token` signed again with its `exp` `seconds` from now (negative: in the past)."""
    claims = jwt.decode(token, options={"verify_signature": False})
    claims["exp"] = int(time.time()) + seconds
    return jwt.encode(claims, jwt_secret, algorithm="HS256")


# MARK: - Raw sockets

class Raw:
    def __init__(self, path=PATH, headers=None, rcvbuf=None):
        self.sock = socket.socket()
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(WAIT)
        self.sock.connect((HOST, PORT))
        self.key = base64.b64encode(os.urandom(16)).decode()
        lines = [f"GET {path} HTTP/1.1", f"Host: {HOST}:{PORT}"]
        default = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Key": self.key,
                   "Sec-WebSocket-Version": "13"}
        default.update(headers or {})
        lines += [f"{k}: {v}" for k, v in default.items() if v is not None]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        self.buffer = b""
        head = self.read_until(b"\r\n\r\n")
        self.status = int(head.split(b" ")[1])
        self.head = head.decode()
        if self.status != 101:
            length = int(self.header("content-length") or 0)
            self.body = self.read_exactly(length)

    def header(self, name):
        for line in self.head.split("\r\n")[1:]:
            key, _, value = line.partition(":")
            if key.strip().lower() == name:
                return value.strip()
        return None

    def fill(self):
        chunk = self.sock.recv(65536)
        if not chunk:
            raise EOFError
        self.buffer += chunk

    def read_until(self, marker):
        while marker not in self.buffer:
            self.fill()
        head, _, self.buffer = self.buffer.partition(marker)
        return head

    def read_exactly(self, count):
        while len(self.buffer) < count:
            self.fill()
        out, self.buffer = self.buffer[:count], self.buffer[count:]
        return out

    def send_frame(self, opcode, payload=b"", fin=True, masked=True, length=None):
        first = (0x80 if fin else 0) | opcode
        size = len(payload) if length is None else length
        mask_bit = 0x80 if masked else 0
        if size < 126:
            header = struct.pack("!BB", first, mask_bit | size)
        elif size <= 0xFFFF:
            header = struct.pack("!BBH", first, mask_bit | 126, size)
        else:
            header = struct.pack("!BBQ", first, mask_bit | 127, size)
        if masked:
            key = os.urandom(4)
            header += key
            payload = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(header + payload)

    def read_frame(self):
        first, second = self.read_exactly(2)
        assert second & 0x80 == 0, "server frames are never masked"
        size = second & 0x7F
        if size == 126:
            size = struct.unpack("!H", self.read_exactly(2))[0]
        elif size == 127:
            size = struct.unpack("!Q", self.read_exactly(8))[0]
        return first & 0x0F, self.read_exactly(size)

    def read_close(self):
        """The close code the server sent (skipping data frames), then checks it closes."""
        while True:
            opcode, payload = self.read_frame()
            if opcode == 8:
                code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else None
                break
        try:
            while self.sock.recv(65536):
                pass
        except (ConnectionResetError, socket.timeout):
            pass
        return code

    def send_json(self, value):
        self.send_frame(1, json.dumps(value).encode())

    def read_json(self):
        while True:
            opcode, payload = self.read_frame()
            if opcode == 1:
                return json.loads(payload)
            assert opcode in (9, 10), f"unexpected opcode {opcode}"


def join_payload(token, bindings, presence=False):
    # realtime-js's RealtimeChannel.subscribe(): default broadcast and presence config on every join.
    return {"config": {"broadcast": {"ack": False, "self": False}, "presence": {"key": "", "enabled": presence},
                       "postgres_changes": bindings, "private": False},
            "access_token": token}


def raw_tests():
    raw = Raw()
    assert raw.status == 101, raw.head
    expected = base64.b64encode(hashlib.sha1((raw.key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
    assert raw.header("sec-websocket-accept") == expected, raw.head
    assert raw.header("upgrade").lower() == "websocket" and raw.header("connection").lower() == "upgrade", raw.head
    step("handshake: 101 with Sec-WebSocket-Accept")

    plain = Raw(headers={"Upgrade": None, "Connection": None})
    assert plain.status == 400 and json.loads(plain.body)["code"], plain.head
    old = Raw(headers={"Sec-WebSocket-Version": "8"})
    assert old.status == 426 and old.header("sec-websocket-version") == "13", old.head
    wrong_key = Raw(path="/realtime/v1/websocket?apikey=wrong&vsn=2.0.0")
    assert wrong_key.status == 401, wrong_key.head
    bad_vsn = Raw(path="/realtime/v1/websocket?apikey=anon-key&vsn=3.0.0")
    assert bad_vsn.status == 400, bad_vsn.head
    step("refused handshakes: no upgrade 400, version 426, apikey 401, vsn 400")

    raw.send_frame(9, b"are you there")
    assert raw.read_frame() == (10, b"are you there")
    raw.send_frame(1, b"[null,\"1\",\"phoenix\",\"heartbeat\",{}]")
    assert raw.read_json() == [None, "1", "phoenix", "phx_reply", {"status": "ok", "response": {}}]
    raw.send_frame(8, struct.pack("!H", 1000) + b"bye")
    opcode, payload = raw.read_frame()
    assert opcode == 8 and struct.unpack("!H", payload[:2])[0] == 1000, payload
    step("ping/pong, heartbeat, close handshake echoes 1000")

    unmasked = Raw()
    unmasked.send_frame(1, b"hello", masked=False)
    assert unmasked.read_close() == 1002
    step("unmasked client frame -> 1002")

    huge = Raw()
    huge.send_frame(2, b"", length=1 << 20)  # only the header of a 1 MiB frame
    assert huge.read_close() == 1009
    step("oversized frame -> 1009")

    pieces = Raw()
    pieces.send_frame(1, b"a" * 40000, fin=False)
    pieces.send_frame(0, b"a" * 40000)
    assert pieces.read_close() == 1009
    step("oversized fragmented message -> 1009")

    control = Raw()
    control.send_frame(9, b"x", fin=False)
    assert control.read_close() == 1002
    step("fragmented control frame -> 1002")

    utf8 = Raw()
    utf8.send_frame(1, b"\xed\xa0\x80")
    assert utf8.read_close() == 1007
    step("text that is not UTF-8 -> 1007")

    # UTF-8 is checked on the whole message: a character split across fragments is fine.
    split = Raw()
    text = '[null,"u","phoenix","heartbeat",{"\u00e9":1}]'.encode()
    cut = text.index(b"\xc3") + 1
    split.send_frame(1, text[:cut], fin=False)
    split.send_frame(0, text[cut:])
    assert split.read_json() == [None, "u", "phoenix", "phx_reply", {"status": "ok", "response": {}}]
    for name, frames in [
        ("ping of 126 bytes", [(9, b"x" * 126, True)]),
        ("reserved bit", [(0x40 | 1, b"{}", True)]),
        ("unknown opcode", [(3, b"", True)]),
        ("continuation without a message", [(0, b"{}", True)]),
        ("new message inside a fragmented one", [(1, b"[", False), (1, b"{}", True)]),
        ("close code 1005 (not for the wire)", [(8, struct.pack("!H", 1005), True)]),
    ]:
        bad = Raw()
        for opcode, payload, fin in frames:
            bad.send_frame(opcode, payload, fin=fin)
        code = bad.read_close()
        assert code == 1002, (name, code)
    step("oversized control frame, reserved bits, unknown opcode, stray continuation, bad close code -> 1002")

    half = Raw()
    half.sock.shutdown(socket.SHUT_WR)
    try:
        assert half.sock.recv(1) == b"", "server kept a half-open socket"
    except ConnectionResetError:
        pass
    step("half-open connection is closed")

    # A slow reader: a small receive window, a channel, and more than the server's 4 KiB
    # buffer plus the socket buffers in changes. It is closed with 1013, not buffered for.
    slow = Raw(rcvbuf=4096)
    token = session_a["access_token"]
    slow.send_json(["1", "1", "realtime:slow", "phx_join", join_payload(token, [{"event": "INSERT", "schema": "public", "table": "events"}])])
    reply = slow.read_json()
    assert reply[3] == "phx_reply" and reply[4]["status"] == "ok", reply
    count = 200
    for _ in range(count // 20):
        insert(token, kind="bulk", payload={"blob": "x" * 30000}, count=20)
    received = 0
    code = None
    while True:
        opcode, payload = slow.read_frame()
        if opcode == 8:
            code = struct.unpack("!H", payload[:2])[0]
            break
        if opcode == 1 and json.loads(payload)[3] == "postgres_changes":
            received += 1
    assert code == 1013 and received < count, (code, received)
    step(f"slow reader is closed with 1013 ({received} of {count} changes sent)")


# MARK: - Independent client: websockets

async def recv(ws, version="2"):
    message = json.loads(await asyncio.wait_for(ws.recv(), WAIT))
    if version == "1":
        # supabase-swift's RealtimeMessageV2: an object whose payload is an object.
        assert set(message) == {"join_ref", "ref", "topic", "event", "payload"}, message
        assert isinstance(message["payload"], dict), message
        return [message["join_ref"], message["ref"], message["topic"], message["event"], message["payload"]]
    assert isinstance(message, list) and len(message) == 5, message
    return message


async def assert_quiet(ws, token, ref, what):
    """Inserts a row of `token`'s user, then sends a heartbeat: its answer comes first, nothing
    reached the socket's channels (`what` says what would have been wrong)."""
    insert(token)
    await ws.send(json.dumps([None, ref, "phoenix", "heartbeat", {}]))
    beat = await recv(ws)
    assert beat[1] == ref and beat[3] == "phx_reply", f"{what}: {beat}"


async def client_tests():
    token_a, token_b = session_a["access_token"], session_b["access_token"]
    user_a = user_of(token_a)
    url = f"ws://{HOST}:{PORT}{PATH}"
    every = [{"event": "INSERT", "schema": "public", "table": "events"}]

    # Before sign-in realtime-js joins without access_token (while it has no token yet), or
    # with the app's key (supabase-js's token callback gives the key without a session): as
    # on Supabase the join is answered ok; nobody's rows reach it until a user's token binds
    # it. The witness socket's channels (A's, B's) tell when a row was fanned out.
    async with websockets.connect(url) as ws, websockets.connect(url) as witness:
        early = join_payload(None, every)
        del early["access_token"]
        await ws.send(json.dumps(["1", "1", "realtime:early", "phx_join", early]))
        reply = await recv(ws)
        assert reply[:4] == ["1", "1", "realtime:early", "phx_reply"] and reply[4]["status"] == "ok", reply
        [binding] = reply[4]["response"]["postgres_changes"]
        system = await recv(ws)
        assert system[2:4] == ["realtime:early", "system"] and system[4]["status"] == "ok", system
        await ws.send(json.dumps(["2", "2", "realtime:keyed", "phx_join", join_payload("anon-key", every)]))
        assert (await recv(ws))[4]["status"] == "ok"
        assert (await recv(ws))[3] == "system"
        for number, token in enumerate([token_a, token_b]):
            ref = str(number + 1)
            await witness.send(json.dumps([ref, ref, f"realtime:witness{number}", "phx_join", join_payload(token, every)]))
            assert (await recv(witness))[4]["status"] == "ok"
            assert (await recv(witness))[3] == "system"

        async def fanned_out(token):
            row = insert(token)
            change = await recv(witness)
            assert change[3] == "postgres_changes" and change[4]["data"]["record"]["seq"] == row["seq"], change
            return row

        async def quiet(ref, what):
            await ws.send(json.dumps([None, ref, "phoenix", "heartbeat", {}]))
            beat = await recv(ws)
            assert beat[1] == ref and beat[3] == "phx_reply", f"{what}: {beat}"

        await fanned_out(token_a)
        await fanned_out(token_b)
        await quiet("h2", "a row reached a channel without a user")
        await ws.send(json.dumps(["1", "3", "realtime:early", "access_token", {"access_token": token_a}]))
        bound = await recv(ws)
        assert bound[1:4] == ["3", "realtime:early", "phx_reply"] and bound[4]["status"] == "ok", bound
        await fanned_out(token_b)
        row = await fanned_out(token_a)
        change = await recv(ws)
        assert change[2:4] == ["realtime:early", "postgres_changes"] and change[4]["ids"] == [binding["id"]], change
        assert change[4]["data"]["record"] == row, change
        await quiet("h5", "B's row reached the channel A's token bound, or a row the keyed one")
        # Left explicitly: the channels are given back before the next tests count them.
        for sock, join_ref, topic in [(ws, "1", "realtime:early"), (ws, "2", "realtime:keyed"),
                                      (witness, "1", "realtime:witness0"), (witness, "2", "realtime:witness1")]:
            await sock.send(json.dumps([join_ref, "9", topic, "phx_leave", {}]))
            left = await recv(sock)
            assert left[1:4] == ["9", topic, "phx_reply"] and left[4]["status"] == "ok", left
            assert (await recv(sock))[2:4] == [topic, "phx_close"]
        step("a join before sign-in (no access_token, the app's key) is ok, gets no row until a user's token binds it")

    # The server runs with TRUNK_SYNC_REALTIME_MAX_CHANNELS_PER_USER=3.
    async with websockets.connect(url) as ws:
        for number in range(4):
            await ws.send(json.dumps([str(number), str(number), f"realtime:cap{number}", "phx_join", join_payload(token_b, every)]))
            reply = await recv(ws)
            if number < 3:
                assert reply[4]["status"] == "ok", reply
                assert (await recv(ws))[3] == "system"
            else:
                assert reply[4]["status"] == "error" and "channels joined already" in reply[4]["response"]["reason"], reply
        step("channels over the per-user cap are refused in the join's reply")

    async with websockets.connect(url) as ws:
        bindings = [
            {"event": "INSERT", "schema": "public", "table": "events"},
            {"event": "*", "schema": "public", "table": "events", "filter": f"seq=gt.0"},
            {"event": "INSERT", "schema": "public", "table": "events", "filter": "type=neq.note"},
        ]
        await ws.send(json.dumps(["1", "1", "realtime:room", "phx_join", join_payload(token_a, bindings)]))
        reply = await recv(ws)
        assert reply[:4] == ["1", "1", "realtime:room", "phx_reply"] and reply[4]["status"] == "ok", reply
        server = reply[4]["response"]["postgres_changes"]
        assert [(b["event"], b["schema"], b["table"], b.get("filter")) for b in server] == \
            [(b["event"], b["schema"], b["table"], b.get("filter")) for b in bindings], server
        ids = [b["id"] for b in server]
        assert all(type(i) is int for i in ids) and len(set(ids)) == 3, ids
        system = await recv(ws)
        assert system[3] == "system" and system[4]["status"] == "ok" and system[4]["extension"] == "postgres_changes", system
        # The subscription is live before the ok: an insert right after it arrives.
        row = insert(token_a)
        change = await recv(ws)
        assert change[2:4] == ["realtime:room", "postgres_changes"] and change[0] == "1" and change[1] is None, change
        assert sorted(change[4]["ids"]) == sorted(ids[:2]) and all(type(i) is int for i in change[4]["ids"]), change
        data = change[4]["data"]
        assert data["record"] == row and data["type"] == "INSERT" and data["errors"] is None, data
        assert data["commit_timestamp"] == row["created_at"], data
        other = insert(token_a, kind="other")
        change = await recv(ws)
        assert sorted(change[4]["ids"]) == sorted(ids) and change[4]["data"]["record"]["seq"] == other["seq"], change
        step("vsn 2.0.0 (realtime-js): join reply ids by position, system, change with the same ids")

        # Broadcast as realtime-js sends it: a binary frame (kind 3 user broadcast push).
        join_ref, ref, topic, event = b"1", b"7", b"realtime:room", b"cursor"
        frame = bytes([3, len(join_ref), len(ref), len(topic), len(event), 0, 1]) + join_ref + ref + topic + event + b'{"x":1}'
        await ws.send(frame)
        refused = await recv(ws)
        assert refused[:4] == ["1", "7", "realtime:room", "phx_reply"] and refused[4]["status"] == "error", refused
        assert "Broadcast" in refused[4]["response"]["reason"], refused
        await ws.send(json.dumps(["1", "8", "realtime:room", "broadcast", {"type": "broadcast", "event": "e", "payload": {}}]))
        refused = await recv(ws)
        assert refused[1] == "8" and refused[4]["status"] == "error", refused
        await ws.send(json.dumps(["2", "2", "realtime:presence", "phx_join", join_payload(token_a, [], presence=True)]))
        refused = await recv(ws)
        assert refused[1] == "2" and refused[4]["status"] == "error" and "Presence" in refused[4]["response"]["reason"], refused
        step("Broadcast (binary and JSON) and Presence refused with an error reply")

        for number, (bad, reason) in enumerate([
            ({"event": "INSERT", "schema": "public", "table": "secrets"}, "unknown table"),
            ({"event": "INSERT", "schema": "public", "table": "events", "filter": "payload=eq.1"}, "JSON"),
            ({"event": "INSERT", "schema": "public", "table": "events", "filter": "seq=like.1"}, "operator"),
            ({"event": "INSERT", "schema": "public", "table": "events", "filter": "seq=eq.x"}, "integer"),
            ({"event": "INSERT", "schema": "auth", "table": "users"}, "public"),
            ({"event": "INSERT", "schema": "public", "table": "events", "filter": "owner=eq.1"}, "unknown column"),
            ({"event": "INSERT", "schema": "public", "table": "events", "filter": "user_id"}, "column=operator.value"),
            ({"event": "INSERT", "schema": "public", "table": "events",
              "filter": "seq=in.(" + ",".join(map(str, range(101))) + ")"}, "at most 100 values"),
            ({"event": "insert", "schema": "public", "table": "events"}, "event must be"),
            ({"event": "INSERT", "schema": 5, "table": "events"}, "schema must be a string"),
            ({"event": "INSERT", "schema": "public", "table": "events", "filter": 5}, "filter must be a string"),
            ("INSERT", "must be an object"),
            ({"event": "INSERT", "schema": "public", "table": 5}, "table must be a string"),
            ({"event": "INSERT", "schema": "public", "filter": "seq=gt.0"}, "a filter needs a table"),
            ({"event": "INSERT", "schema": "public", "table": "*", "filter": "seq=gt.0"}, "a filter needs a table"),
            ({"event": "INSERT", "schema": "public", "table": "events", "select": ["id"]}, "select is not supported"),
            ({"event": "INSERT", "schema": "public", "table": "events", "filter": "type=eq.note,seq=gt.5"},
             "one condition per filter"),
            ({"event": "INSERT", "schema": "public", "table": "events", "filter": "type=not.eq.note"}, "operator not"),
            ({"event": "INSERT", "schema": "public", "table": "events", "filter": "type=like.n%"}, "operator like"),
        ]):
            ref = str(100 + number)
            await ws.send(json.dumps([ref, ref, f"realtime:bad{number}", "phx_join", join_payload(token_a, [bad])]))
            refused = await recv(ws)
            assert refused[1] == ref and refused[4]["status"] == "error" and reason in refused[4]["response"]["reason"], refused
        await ws.send(json.dumps(["20", "20", "realtime:anon", "phx_join", join_payload("", [bindings[0]])]))
        assert (await recv(ws))[4]["status"] == "error"
        await ws.send(json.dumps(["21", "21", "realtime:forged", "phx_join", join_payload(token_a[:-4] + "AAAA", [bindings[0]])]))
        assert (await recv(ws))[4]["status"] == "error"
        await ws.send("not json")
        assert (await recv(ws))[4]["status"] == "error"
        # Every message of a channel repeats its topic: a long one is refused at the join.
        await ws.send(json.dumps(["22", "22", "realtime:" + "t" * 248, "phx_join", join_payload(token_a, [bindings[0]])]))
        refused = await recv(ws)
        assert refused[1] == "22" and refused[4]["status"] == "error" and "topic" in refused[4]["response"]["reason"], refused
        # Whole joins of the wrong shape, each refused in its reply and joining nothing.
        many = [bindings[0]] * 101
        config = join_payload(token_a, [bindings[0]])
        for number, (topic, payload, reason) in enumerate([
            ("room", config, "unmatched topic"),
            ("realtime:", config, "needs a name"),
            ("realtime:many", join_payload(token_a, many), "at most 100 postgres_changes bindings"),
            ("realtime:shape", "INSERT", "payload of phx_join must be an object"),
            ("realtime:shape", {"config": "all", "access_token": token_a}, "config must be an object"),
            ("realtime:shape", {"config": {"postgres_changes": {"event": "*"}}, "access_token": token_a},
             "postgres_changes must be an array"),
            ("realtime:shape", {"config": {"postgres_changes": [bindings[0]]}, "access_token": 5}, "access_token"),
        ]):
            ref = str(40 + number)
            await ws.send(json.dumps([ref, ref, topic, "phx_join", payload]))
            refused = await recv(ws)
            assert refused[1:4] == [ref, topic, "phx_reply"] and refused[4]["status"] == "error", refused
            assert reason in refused[4]["response"]["reason"], (reason, refused)
        for event, reason in [("access_token", "unmatched topic"), ("custom", "unmatched topic")]:
            await ws.send(json.dumps(["1", "50", "realtime:shape", event, {"access_token": token_a}]))
            refused = await recv(ws)
            assert refused[1] == "50" and refused[4]["status"] == "error" and reason in refused[4]["response"]["reason"], refused
        for text in ['["1","51"]', '{"topic":"realtime:room"}', '[1,2,null,"phx_join",{}]', '[null,null,"realtime:room",true,{}]']:
            await ws.send(text)
            refused = await recv(ws)
            assert refused[2:4] == ["phoenix", "phx_reply"] and refused[4]["status"] == "error", refused
            assert "malformed message" in refused[4]["response"]["reason"], refused
        # None of them joined anything: a row reaches the one channel joined, once.
        row = insert(token_a)
        change = await recv(ws)
        assert change[2:4] == ["realtime:room", "postgres_changes"] and change[4]["data"]["record"]["seq"] == row["seq"], change
        await ws.send(json.dumps([None, "52", "phoenix", "heartbeat", {}]))
        beat = await recv(ws)
        assert beat[1] == "52" and beat[3] == "phx_reply", f"a refused join received a row: {beat}"
        step("bad joins (table, column, filter, schema, types, bindings, token, topic) and malformed messages get error replies")

        # A user's filters together are bounded (TRUNK_SYNC_REALTIME_MAX_FILTER_BYTES=1024 here:
        # each channel keeps its filters parsed while joined); leaving gives their bytes back.
        def twenty_ids():
            ids = ",".join(str(uuid.uuid4()) for _ in range(20))
            return [{"event": "INSERT", "schema": "public", "table": "events", "filter": f"client_id=in.({ids})"}]
        await ws.send(json.dumps(["80", "80", "realtime:ids", "phx_join", join_payload(token_a, twenty_ids())]))
        joined = await recv(ws)
        assert joined[1] == "80" and joined[4]["status"] == "ok", joined
        assert (await recv(ws))[3] == "system"
        more = join_payload(token_a, twenty_ids())
        await ws.send(json.dumps(["81", "81", "realtime:more", "phx_join", more]))
        refused = await recv(ws)
        assert refused[1] == "81" and refused[4]["status"] == "error", refused
        assert "bytes of postgres_changes filters; at most 1024" in refused[4]["response"]["reason"], refused
        await ws.send(json.dumps(["80", "82", "realtime:ids", "phx_leave", {}]))
        assert (await recv(ws))[1] == "82"
        assert (await recv(ws))[2:4] == ["realtime:ids", "phx_close"]
        await ws.send(json.dumps(["83", "83", "realtime:more", "phx_join", more]))
        joined = await recv(ws)
        assert joined[1] == "83" and joined[4]["status"] == "ok", joined
        assert (await recv(ws))[3] == "system"
        await ws.send(json.dumps(["83", "84", "realtime:more", "phx_leave", {}]))
        assert (await recv(ws))[1] == "84"
        assert (await recv(ws))[2:4] == ["realtime:more", "phx_close"]
        step("a user's filters together are bounded in bytes; leaving gives them back")

        # A token past its exp is refused at the join and in access_token, though the
        # verifier's clock leeway (30 s) would let it pass: a channel ends at exp.
        expired = expiring(token_a, -5)
        await ws.send(json.dumps(["60", "60", "realtime:late", "phx_join", join_payload(expired, [bindings[0]])]))
        refused = await recv(ws)
        assert refused[1] == "60" and refused[4]["status"] == "error" and "expired" in refused[4]["response"]["reason"], refused
        await ws.send(json.dumps(["1", "61", "realtime:room", "access_token", {"access_token": expired}]))
        system = await recv(ws)
        assert system[2:4] == ["realtime:room", "system"] and system[4]["status"] == "error", system
        assert system[4]["extension"] == "system" and "expired" in system[4]["message"], system
        closed = await recv(ws)
        assert closed[2:4] == ["realtime:room", "phx_close"], closed
        step("a token past its exp is refused at the join and in access_token")

        # A channel whose token expires while joined is ended (as Supabase Realtime ends it:
        # a system error, then phx_close), and nothing reaches it after.
        await ws.send(json.dumps(["70", "70", "realtime:soon", "phx_join", join_payload(expiring(token_a, 2), [bindings[0]])]))
        joined = await recv(ws)
        assert joined[1] == "70" and joined[4]["status"] == "ok", joined
        assert (await recv(ws))[3] == "system"
        message = await recv(ws)
        assert message[2:4] == ["realtime:soon", "system"] and message[4]["status"] == "error", message
        assert message[4]["extension"] == "system" and "expired" in message[4]["message"], message
        closed = await recv(ws)
        assert closed[2:4] == ["realtime:soon", "phx_close"], closed
        await assert_quiet(ws, token_a, "71", "a row after the token expired")
        # Its topic is free again, and counts no more: a fresh token joins it.
        await ws.send(json.dumps(["72", "72", "realtime:room", "phx_join", join_payload(token_a, bindings)]))
        rejoined = await recv(ws)
        assert rejoined[1] == "72" and rejoined[4]["status"] == "ok", rejoined
        assert (await recv(ws))[3] == "system"
        step("a token expiring while joined ends the channel (system error, phx_close), nothing after")

        await ws.send(json.dumps(["1", "30", "realtime:room", "phx_leave", {}]))
        left = await recv(ws)
        assert left[1] == "30" and left[3] == "phx_reply" and left[4]["status"] == "ok", left
        closed = await recv(ws)
        assert closed[2:4] == ["realtime:room", "phx_close"], closed
        await assert_quiet(ws, token_a, "31", "a change after phx_leave")
        step("phx_leave: ok, phx_close, nothing more")

    # profiles UPDATE: a profile change through /rest/v1/profiles, shaped as it returns it.
    async with websockets.connect(url) as ws:
        binding = {"event": "UPDATE", "schema": "public", "table": "profiles", "filter": f"id=eq.{user_a}"}
        await ws.send(json.dumps(["1", "1", "realtime:profile", "phx_join", join_payload(token_a, [binding])]))
        reply = await recv(ws)
        assert reply[4]["status"] == "ok", reply
        profile_id = reply[4]["response"]["postgres_changes"][0]["id"]
        assert (await recv(ws))[3] == "system"
        request = urllib.request.Request(
            base_url + f"/rest/v1/profiles?id=eq.{user_a}", data=json.dumps({"full_name": "Ada Realtime"}).encode(),
            method="PATCH", headers={"Content-Type": "application/json", "apikey": "anon-key",
                                     "Authorization": "Bearer " + token_a, "Prefer": "return=representation"})
        with urllib.request.urlopen(request, timeout=10) as response:
            row = json.loads(response.read().decode())[0]
        change = await recv(ws)
        assert change[3] == "postgres_changes" and change[4]["ids"] == [profile_id], change
        data = change[4]["data"]
        assert data["type"] == "UPDATE" and data["table"] == "profiles" and data["record"] == row, (data, row)
        assert data["old_record"] == {"id": user_a} and data["commit_timestamp"] == row["updated_at"], data
        await assert_quiet(ws, token_a, "9", "an event reached a profiles binding")  # an event is no profile change
        step("profiles UPDATE arrives as /rest/v1/profiles returns the row")
        # updateUser({data: {full_name}}) names the profile too: its subscribers hear of it at once.
        request = urllib.request.Request(
            base_url + "/auth/v1/user", data=json.dumps({"data": {"full_name": "Ada Meta"}}).encode(),
            method="PUT", headers={"Content-Type": "application/json", "Authorization": "Bearer " + token_a})
        urllib.request.urlopen(request, timeout=10).close()
        change = await recv(ws)
        assert change[3] == "postgres_changes" and change[4]["ids"] == [profile_id], change
        assert change[4]["data"]["record"]["full_name"] == "Ada Meta", change
        step("profiles UPDATE arrives after updateUser names the profile")

    # vsn 1.0.0 objects, as supabase-swift speaks them; B's filter names A's rows.
    url1 = f"ws://{HOST}:{PORT}/realtime/v1/websocket?apikey=anon-key&vsn=1.0.0"
    async with websockets.connect(url1) as ws:
        await ws.send(json.dumps({"join_ref": "1", "ref": "1", "topic": "realtime:public:events", "event": "phx_join",
                                  "payload": join_payload(token_b, [{"event": "*", "schema": "public", "table": "events",
                                                                     "filter": f"user_id=eq.{user_a}"},
                                                                    {"event": "INSERT", "schema": "public", "table": "events"}])}))
        reply = await recv(ws, "1")
        assert reply[3] == "phx_reply" and reply[4]["status"] == "ok", reply
        ids = [b["id"] for b in reply[4]["response"]["postgres_changes"]]
        assert all(type(i) is int for i in ids), ids
        assert (await recv(ws, "1"))[3] == "system"
        insert(token_a)
        mine = insert(token_b)
        change = await recv(ws, "1")
        assert change[3] == "postgres_changes" and change[4]["ids"] == [ids[1]], change
        assert change[4]["data"]["record"]["seq"] == mine["seq"] and change[4]["data"]["record"]["user_id"] == user_of(token_b), change
        await ws.send(json.dumps({"join_ref": None, "ref": "5", "topic": "phoenix", "event": "heartbeat", "payload": {}}))
        beat = await recv(ws, "1")
        assert beat[1] == "5" and beat[3] == "phx_reply", f"another user's row arrived: {beat}"
        step("vsn 1.0.0 (supabase-swift shapes); another user's rows never arrive whatever the filter")

        # A token of another user on the channel ends it.
        await ws.send(json.dumps({"join_ref": "1", "ref": "6", "topic": "realtime:public:events", "event": "access_token",
                                  "payload": {"access_token": token_a}}))
        system = await recv(ws, "1")
        assert system[3] == "system" and system[4]["status"] == "error", system
        closed = await recv(ws, "1")
        assert closed[3] == "phx_close", closed
        step("access_token of another user ends the channel")

    # Graceful shutdown closes open sockets with 1001.
    ws = await websockets.connect(url)
    await ws.send(json.dumps(["1", "1", "realtime:last", "phx_join", join_payload(token_a, [bindings[0]])]))
    assert (await recv(ws))[4]["status"] == "ok"
    print("stop now", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    try:
        while True:
            await asyncio.wait_for(ws.recv(), WAIT)
    except websockets.exceptions.ConnectionClosed as closed:
        assert closed.rcvd is not None and closed.rcvd.code == 1001, closed
    step("shutdown closes with 1001")


raw_tests()
asyncio.run(client_tests())
