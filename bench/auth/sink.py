#!/usr/bin/env python3
"""bench/auth's mail sink: a small SMTP server that records each sign-in code it receives.

    sink.py CODES_FILE     listens on 127.0.0.1 at a free port, prints "ready PORT"

For each message it appends "ADDRESS CODE" to CODES_FILE (the RCPT TO address and the
6-digit code of the subject "Your sign-in code: CODE"), flushed at once, so the driver can
look the codes up without asking the sink anything. Speaks just what trunk-sync's SMTP
client sends without TLS or AUTH (EHLO, MAIL, RCPT, DATA, RSET, NOOP, QUIT), one asyncio
protocol object per connection, no parsing beyond the subject line: scripts/smtp-sink.py
(aiosmtpd, MIME checks) is the tests' sink; this one must stay far from being the
bottleneck (run.sh reports its CPU time). Exits on SIGTERM.
"""
import asyncio
import re
import signal
import sys

SUBJECT = re.compile(rb"^Subject: Your sign-in code: (\d{6})\r?$", re.MULTILINE)


class Session(asyncio.Protocol):
    def __init__(self, out):
        self.out = out
        self.buffer = b""
        self.data = None  # the message's lines while in DATA
        self.recipient = b""

    def connection_made(self, transport):
        self.transport = transport
        transport.write(b"220 sink.bench ESMTP\r\n")

    def data_received(self, chunk):
        self.buffer += chunk
        replies = []
        while True:
            end = self.buffer.find(b"\r\n")
            if end < 0:
                break
            line, self.buffer = self.buffer[:end], self.buffer[end + 2:]
            if self.data is not None:
                if line == b".":
                    match = SUBJECT.search(b"\r\n".join(self.data))
                    if match:
                        self.out.write(self.recipient + b" " + match.group(1) + b"\n")
                        self.out.flush()
                    self.data = None
                    replies.append(b"250 OK\r\n")
                else:
                    self.data.append(line)
                continue
            verb = line[:4].upper()
            if verb in (b"EHLO", b"HELO"):
                replies.append(b"250-sink.bench\r\n250 8BITMIME\r\n")
            elif verb == b"MAIL" or verb == b"RSET" or verb == b"NOOP":
                replies.append(b"250 OK\r\n")
            elif verb == b"RCPT":
                self.recipient = line[line.find(b"<") + 1:line.rfind(b">")]
                replies.append(b"250 OK\r\n")
            elif verb == b"DATA":
                self.data = []
                replies.append(b"354 go ahead\r\n")
            elif verb == b"QUIT":
                self.transport.write(b"".join(replies) + b"221 bye\r\n")
                self.transport.close()
                return
            else:
                replies.append(b"502 not here\r\n")
        if replies:
            self.transport.write(b"".join(replies))


async def main():
    out = open(sys.argv[1], "ab")
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Session(out), "127.0.0.1", 0, backlog=1024)
    print(f"ready {server.sockets[0].getsockname()[1]}", flush=True)
    done = loop.create_future()

    def finish():
        if not done.done():
            done.set_result(None)

    loop.add_signal_handler(signal.SIGTERM, finish)
    await done
    server.close()
    out.close()


if __name__ == "__main__":
    asyncio.run(main())
