#!/usr/bin/env python3
"""`make drill-failover`: a database server lost under load, with the real binary.

    drill-failover.py TRUNK_SYNC_BINARY

1. A primary and a streaming synchronous standby (two private clusters, pg_basebackup);
   trunk-sync is given both in TRUNK_SYNC_DATABASE_URL (libpq's multi-host form with
   target_session_attrs=read-write), as docs/operations.md says.
2. Clients push continuously (one event per request, each client_id new), a long-poll
   client and an event stream follow along.
3. The primary is killed (SIGKILL, postmaster and its processes) and the standby promoted,
   as an operator or a failover manager would; synchronous_standby_names, which
   pg_basebackup copied, is cleared on it (it has no standby of its own).
4. Checks: every push answered 200 is on the new primary exactly once; the server moved the
   seqs on the new WAL timeline once, without `migrate`; every other answer
   was a retryable 503 with Retry-After (or no answer); retrying the unanswered ones with the
   same client_id stores each exactly once; the same server process serves again within
   10 s of the promotion, without a restart; the long-poll and the stream see events pushed
   after the failover, and the stream (one client from before the failover to the end,
   reconnecting with Last-Event-ID when the server ends it) every acknowledged push.

Prints "failover: ok ..." per step and "failover: passed"; exits 1 with the reason otherwise.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid

repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ in scripts/
sys.path.insert(0, os.path.join(repo, "scripts"))
from server_port import server_port  # noqa: E402
binary = sys.argv[1]
work = tempfile.mkdtemp(prefix="trunk-sync-failover.")
os.chmod(work, 0o755)
is_root = os.geteuid() == 0
pgbin = sorted(
    (os.path.join("/usr/lib/postgresql", v, "bin") for v in os.listdir("/usr/lib/postgresql")),
    key=lambda p: [int(x) for x in p.split("/")[-2].split(".") if x.isdigit()],
)[-1]
processes = []


def log(message):
    print(f"failover: {message}", flush=True)


def fail(message):
    raise SystemExit(f"failover: FAILED: {message}")


def run(args, **kwargs):
    return subprocess.run(args, check=True, capture_output=True, text=True, **kwargs)


def as_owner(args):
    return (["runuser", "-u", "postgres", "--"] + args) if is_root else args


def pg(*args):
    return run([os.path.join(repo, "scripts/pg.sh"), *args])


def psql(url, sql):
    return run(["psql", url, "-qAtX", "-c", sql]).stdout.strip()


def url(directory, database="postgres"):
    return pg("url", directory, database).stdout.strip()


def wait_until(what, check, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:
            pass
        time.sleep(0.1)
    fail(f"{what} (waited {timeout} s)")


primary, standby = os.path.join(work, "primary"), os.path.join(work, "standby")
primary_port, standby_port, http_port = server_port(), server_port(), server_port()
server = None
try:
    # 1. Primary, then the standby from a base backup, streaming synchronously.
    pg("start", primary, str(primary_port))
    password = open(os.path.join(primary, "password")).read().strip()
    owner = url(primary)
    psql(owner, "create database trunk_sync")
    os.makedirs(os.path.join(standby, "pgdata"))
    if is_root:
        run(["chown", "-R", "postgres", standby])
    run(
        as_owner([os.path.join(pgbin, "pg_basebackup"), "-D", os.path.join(standby, "pgdata"), "-X", "stream",
                  "-c", "fast", "-d", f"host=127.0.0.1 port={primary_port} user=trunk"]),
        env=dict(os.environ, PGPASSWORD=password),
    )
    conninfo = f"host=127.0.0.1 port={primary_port} user=trunk password={password} application_name=standby"
    with open(os.path.join(standby, "pgdata", "postgresql.auto.conf"), "a") as handle:
        handle.write(f"primary_conninfo = '{conninfo}'\n")
    open(os.path.join(standby, "pgdata", "standby.signal"), "w").close()
    with open(os.path.join(standby, "password"), "w") as handle:
        handle.write(password + "\n")
    if is_root:
        run(["chown", "-R", "postgres", standby])
    os.chmod(os.path.join(standby, "pgdata"), 0o700)
    pg("start", standby, str(standby_port))
    psql(owner, "alter system set synchronous_standby_names = 'standby'")
    psql(owner, "select pg_reload_conf()")
    wait_until(
        "the standby streams synchronously",
        lambda: psql(owner, "select sync_state from pg_stat_replication where application_name = 'standby'") == "sync",
        60,
    )
    log(f"primary :{primary_port}, synchronous standby :{standby_port}")

    server_password = uuid.uuid4().hex
    hosts = f"127.0.0.1:{primary_port},127.0.0.1:{standby_port}"
    env = dict(
        os.environ,
        TRUNK_SYNC_MIGRATION_DATABASE_URL=url(primary, "trunk_sync"),
        TRUNK_SYNC_DATABASE_URL=f"postgres://trunk_sync_server:{server_password}@{hosts}/trunk_sync"
        "?target_session_attrs=read-write&connect_timeout=2",
        TRUNK_SYNC_JWT_SECRET=run(["openssl", "rand", "-base64", "48"]).stdout.strip(),
        TRUNK_SYNC_KEY_ENCRYPTION_KEY=run(["openssl", "rand", "-base64", "48"]).stdout.strip(),
        TRUNK_SYNC_MIGRATIONS_DIR=os.path.join(repo, "migrations"),
        TRUNK_SYNC_HOST="127.0.0.1",
        TRUNK_SYNC_PORT=str(http_port),
        TRUNK_SYNC_ADMIN_PORT="0",
        TRUNK_SYNC_DB_POOL_TIMEOUT="5",
        TRUNK_SYNC_LOG_LEVEL=os.environ.get("DRILL_LOG_LEVEL", "info"),
    )
    run([binary, "migrate"], env=env)
    del env["TRUNK_SYNC_MIGRATION_DATABASE_URL"]
    server_log = open(os.path.join(work, "serve.log"), "w")
    server = subprocess.Popen([binary, "serve"], env=env, stdout=server_log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{http_port}"
    wait_until("serve answers /readyz", lambda: urllib.request.urlopen(base + "/readyz", timeout=2).status == 200, 60)
    session = json.loads(run([binary, "token", "--email", "failover@example.com"], env=env).stdout)
    token = session["access_token"]
    log(f"serve {server.pid} on both hosts, target_session_attrs=read-write")

    def request(method, path, body=None, timeout=20):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(base + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), error.read()

    def event(client_id):
        return {"client_id": client_id, "type": "failover", "payload": {}, "client_timestamp": "2026-11-26T12:00:00Z"}

    # 2. Continuous pushes, a long-poll follower and a stream.
    lock = threading.Lock()
    acknowledged, unanswered, refusals = [], [], []
    stop = threading.Event()
    first_ok_after = {}

    def pusher():
        while not stop.is_set():
            client_id = str(uuid.uuid4())
            try:
                status, headers, body = request("POST", "/sync/v1/events", {"events": [event(client_id)]})
            except Exception as error:  # no answer: the client cannot know, and retries
                with lock:
                    unanswered.append((client_id, repr(error)))
                continue
            with lock:
                if status == 200:
                    acknowledged.append(client_id)
                    if "promoted" in first_ok_after and "at" not in first_ok_after:
                        first_ok_after["at"] = time.monotonic()
                else:
                    unanswered.append((client_id, status))
                    refusals.append((status, headers.get("Retry-After"), body[:200]))
                    time.sleep(0.05)

    polled = set()
    cursor = [0]

    def long_poller():
        # One follower throughout: its cursor carries over the failover.
        while not stop.is_set():
            try:
                status, _, body = request("GET", f"/sync/v1/events?after={cursor[0]}&wait=5&limit=1000", timeout=30)
            except Exception:
                time.sleep(0.2)
                continue
            if status != 200:
                time.sleep(0.2)
                continue
            page = json.loads(body)
            with lock:
                polled.update(e["client_id"] for e in page["events"])
            cursor[0] = page["next_after"]

    streamed = set()
    # The stream follows from before the failover to the end of the drill: it has a stop of
    # its own (`stop` pauses the pushers and the long-poll for the accounting in step 4; a
    # stream that returned then would close its connection, which the server rightly logs
    # as client_gone, and would see nothing pushed later). Like an EventSource, it
    # reconnects with Last-Event-ID whenever the server ends it.
    stream_stop = threading.Event()
    stream_opens = []

    def streamer():
        last = "0"
        while not stream_stop.is_set():
            req = urllib.request.Request(f"{base}/sync/v1/stream")
            req.add_header("Authorization", f"Bearer {token}")
            req.add_header("Accept", "text/event-stream")
            req.add_header("Last-Event-ID", last)
            try:
                with urllib.request.urlopen(req, timeout=30) as response:
                    stream_opens.append(last)
                    pending = b""
                    while True:
                        chunk = response.read1(65536)  # what has arrived, not a full buffer
                        if not chunk:
                            break
                        pending += chunk
                        *lines, pending = pending.split(b"\n")
                        for raw in lines:
                            line = raw.decode()
                            if line.startswith("id: "):
                                last = line[4:]
                            elif line.startswith("data: "):
                                with lock:
                                    streamed.add(json.loads(line[6:])["client_id"])
                        if stream_stop.is_set():
                            return
            except Exception as error:
                if os.environ.get("DRILL_LOG_LEVEL") == "debug":
                    print(f"failover: stream: {error!r}", file=sys.stderr, flush=True)
                time.sleep(0.2)
            else:
                if os.environ.get("DRILL_LOG_LEVEL") == "debug":
                    print("failover: stream: ended", file=sys.stderr, flush=True)

    threads = [threading.Thread(target=pusher) for _ in range(3)]
    threads += [threading.Thread(target=long_poller), threading.Thread(target=streamer, daemon=True)]
    for thread in threads:
        thread.start()
    wait_until("pushes are acknowledged", lambda: len(acknowledged) >= 30, 60)
    wait_until("the long-poll and the stream follow", lambda: acknowledged[0] in polled and acknowledged[0] in streamed, 30)

    # 3. The primary dies; the standby is promoted and stops waiting for a standby of its own.
    postmaster = int(open(os.path.join(primary, "pgdata", "postmaster.pid")).readline())
    children = [int(p) for p in run(["ps", "-o", "pid=", "--ppid", str(postmaster)]).stdout.split()]
    for pid in [postmaster] + children:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    with lock:
        before_kill = len(acknowledged)
    log(f"killed the primary (postmaster {postmaster} and {len(children)} processes) after {before_kill} acknowledged pushes")
    run(as_owner([os.path.join(pgbin, "pg_ctl"), "-D", os.path.join(standby, "pgdata"), "-w", "promote"]))
    new_primary = url(standby)
    psql(new_primary, "alter system reset synchronous_standby_names")
    psql(new_primary, "select pg_reload_conf()")
    with lock:
        first_ok_after["promoted"] = time.monotonic()
    log("promoted the standby and cleared its synchronous_standby_names")
    wait_until("a push is acknowledged after the promotion", lambda: "at" in first_ok_after, 60)
    recovery = first_ok_after["at"] - first_ok_after["promoted"]
    log(f"serving again {recovery:.1f} s after the promotion, same process ({server.poll() is None})")
    if server.poll() is not None:
        fail("serve exited")
    if recovery > 10:
        fail(f"serving again took {recovery:.1f} s (more than 10 s)")
    with lock:
        target = len(acknowledged) + 30
    wait_until("pushes continue on the new primary", lambda: len(acknowledged) >= target, 60)
    stop.set()
    for thread in threads[:4]:
        thread.join(timeout=60)

    # 4. What was acknowledged is there once; every refusal was retryable; retries store once.
    bad = [r for r in refusals if r[0] != 503 or not r[1]]
    if bad:
        fail(f"answers other than 503 with Retry-After: {bad[:5]}")
    log(f"{len(acknowledged)} pushes acknowledged, {len(refusals)} answered 503 with Retry-After, "
        f"{len(unanswered) - len(refusals)} without an answer")
    for client_id, _ in unanswered:
        deadline = time.monotonic() + 30
        while True:
            status, _, body = request("POST", "/sync/v1/events", {"events": [event(client_id)]})
            if status == 200:
                break
            if time.monotonic() > deadline:
                fail(f"retrying {client_id} kept answering {status}: {body[:200]}")
            time.sleep(0.2)
    counts = dict(
        line.split("|")
        for line in psql(url(standby, "trunk_sync"), "select client_id, count(*) from events group by client_id").splitlines()
    )
    missing = [c for c in acknowledged if c not in counts]
    if missing:
        fail(f"{len(missing)} acknowledged pushes are not on the new primary: {missing[:5]}")
    twice = {c: n for c, n in counts.items() if n != "1"}
    if twice:
        fail(f"events stored more than once: {list(twice.items())[:5]}")
    retried = [c for c, _ in unanswered if c not in counts]
    if retried:
        fail(f"retried pushes missing: {retried[:5]}")
    log(f"every acknowledged push is on the new primary exactly once; {len(unanswered)} retried, each stored once")

    # The followers: a push after the failover reaches the long-poll and the stream.
    marker = str(uuid.uuid4())
    stop.clear()
    follower = threading.Thread(target=long_poller)
    follower.start()
    status, _, body = request("POST", "/sync/v1/events", {"events": [event(marker)]})
    if status != 200:
        fail(f"the marker push answered {status}: {body[:200]}")
    # The promoted standby is on a new WAL timeline: the server's first connection to it moved
    # every user's next seq past anything a device may have seen, once (SeqTimeline).
    marker_seq = json.loads(body)["results"][0]["seq"]
    if marker_seq < 1_000_000_000:
        fail(f"the seqs did not move on the new timeline: a push after the failover got seq {marker_seq}")
    server_log.flush()
    moves = open(os.path.join(work, "serve.log")).read().count("another WAL timeline")
    if moves != 1:
        fail(f"the server logged {moves} timeline moves, not 1")
    log(f"the server moved the seqs on the new timeline once (a push after it: seq {marker_seq})")
    wait_until("the long-poll sees a push made after the failover", lambda: marker in polled, 30)
    wait_until("the event stream sees a push made after the failover", lambda: marker in streamed, 30)
    wait_until("the event stream saw every acknowledged push", lambda: set(acknowledged) <= streamed, 30)
    stop.set()
    stream_stop.set()
    follower.join(timeout=30)
    ended = len(stream_opens) - 1
    log("the long-poll and the event stream resumed (the stream "
        + (f"was ended by the server {ended} time(s) and resumed from its Last-Event-ID" if ended else "stayed open")
        + "; every acknowledged push reached it)")
    server.send_signal(signal.SIGTERM)
    if server.wait(timeout=30) != 0:
        fail("serve did not stop cleanly")
    server = None
    log("passed")
finally:
    if server is not None:
        server.kill()
        server.wait()
        print(open(os.path.join(work, "serve.log")).read()[-3000:], file=sys.stderr)
    for directory in (primary, standby):
        try:
            pg("stop", directory)
        except Exception:
            pass
    if os.environ.get("DRILL_KEEP") != "1":
        subprocess.run(["rm", "-rf", work])
    else:
        print(f"failover: work directory kept: {work}")
