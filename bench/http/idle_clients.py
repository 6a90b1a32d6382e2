#!/usr/bin/env python3
"""Opens N keep-alive connections to a server, sends one GET on each, checks each answer
is a 200 and keeps every socket open until killed (SIGTERM/SIGINT).

    idle_clients.py HOST PORT COUNT READY_FILE

Writes "COUNT" to READY_FILE once every connection has had its answer; the caller then
measures the server. Needs `ulimit -n` above COUNT.

Against a loopback HOST the connections come from 25 loopback addresses (127.0.0.2 to
127.0.0.26; Linux routes all of 127.0.0.0/8 to the loopback interface), 200 from each,
so they stay under the server's per-client connection cap (256 by default).
"""
import signal
import socket
import sys
import time

BATCH = 500  # stays well under the server's listen backlog
SOURCES = 25  # loopback source addresses: COUNT / SOURCES per client stays under the cap


def read_response(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("closed before the response head")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("closed before the end of the body")
        body += chunk
    return head


def main() -> int:
    host, port, count, ready_file = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    request = f"GET /healthz HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: keep-alive\r\n\r\n".encode()
    sockets = []
    started = time.monotonic()
    while len(sockets) < count:
        batch = []
        for _ in range(min(BATCH, count - len(sockets))):
            index = len(sockets) + len(batch)
            source = (f"127.0.0.{2 + index % SOURCES}", 0) if host.startswith("127.") else None
            sock = socket.create_connection((host, port), timeout=30, source_address=source)
            sock.sendall(request)
            batch.append(sock)
        for sock in batch:
            head = read_response(sock)
            if not head.startswith(b"HTTP/1.1 200"):
                print(f"unexpected answer: {head.splitlines()[0]!r}", file=sys.stderr)
                return 1
            if b"connection: close" in head.lower():
                print("server closed a keep-alive connection", file=sys.stderr)
                return 1
        sockets.extend(batch)
    elapsed = time.monotonic() - started
    print(f"idle_clients: {len(sockets)} connections open in {elapsed:.1f} s", file=sys.stderr)
    with open(ready_file, "w") as out:
        out.write(f"{len(sockets)}\n")

    stop = False

    def on_signal(_number, _frame):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not stop:
        time.sleep(0.2)
    for sock in sockets:
        sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
