#!/usr/bin/env python3
"""Prints a TCP port for a server a script starts itself (PostgreSQL, trunk-sync): free now
and below the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range). A port
picked by binding port 0 comes from that range, where an outgoing connection's local port
(this machine's tests, clients, other runs) can take it before the server binds it:
"Address already in use". Tests/TestSupport/Sockets.swift's serverPort() picks the same way.

    port=$(python3 scripts/server_port.py)      # or: from server_port import server_port
"""
import random
import socket


def server_port():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    candidates = range(10000, low) if low > 11000 else range(1024, max(low, 1025))
    for _ in range(200):
        port = random.choice(candidates)
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        return port
    raise SystemExit(f"no free port below {low}")


if __name__ == "__main__":
    print(server_port())
