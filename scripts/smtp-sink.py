#!/usr/bin/env python3
"""An SMTP sink for tests and local development (Debian: python3-aiosmtpd).

Listens on HOST at a free port (or --port), prints "ready PORT" on stdout once it accepts
connections, and writes each message it receives to DIR as N.eml (the message as received,
dot-stuffing undone) and then N.json (envelope, AUTH mechanism and user, whether TLS was on,
and the message as Python's email package decodes it: an independent check of its MIME).
It exits when its standard input closes, so it never outlives the test that started it.

  --tls-cert/--tls-key   offer STARTTLS with this certificate (or, with --implicit-tls,
                         speak TLS from the first byte)
  --require-starttls     refuse commands other than EHLO/NOOP/QUIT/STARTTLS before TLS
  --auth USER:PASS       offer AUTH and accept only these credentials; MAIL needs AUTH
  --auth-mechanisms M,…  offer only these AUTH mechanisms (default PLAIN,LOGIN)
  --auth-plaintext       offer AUTH without TLS (aiosmtpd requires STARTTLS by default)
"""
import argparse
import asyncio
import json
import os
import ssl
import sys

from email import message_from_bytes, policy

from aiosmtpd.smtp import SMTP, AuthResult, LoginPassword


class Sink:
    def __init__(self, directory):
        self.directory = directory
        self.count = 0

    async def handle_DATA(self, server, session, envelope):
        self.count += 1
        base = os.path.join(self.directory, str(self.count))
        with open(base + ".eml", "wb") as file:
            file.write(envelope.original_content)
        record = {
            "mail_from": envelope.mail_from,
            "rcpt_tos": envelope.rcpt_tos,
            "helo": session.host_name,
            "tls": server.transport.get_extra_info("sslcontext") is not None,
            "auth": getattr(session, "sink_auth", None),
            "parsed": parse(envelope.original_content),
        }
        with open(base + ".json.tmp", "w") as file:
            json.dump(record, file)
        os.rename(base + ".json.tmp", base + ".json")
        return "250 OK stored"


def parse(data):
    try:
        message = message_from_bytes(data, policy=policy.default)
        return {
            "headers": [[name, str(value)] for name, value in message.items()],
            "subject": str(message["subject"]),
            "from": str(message["from"]),
            "to": str(message["to"]),
            "content_type": message.get_content_type(),
            "charset": message.get_content_charset(),
            "body": message.get_content(),
            "defects": [type(defect).__name__ for defect in message.defects],
        }
    except Exception as error:  # reported to the test, which fails on it
        return {"error": repr(error)}


class Authenticator:
    def __init__(self, user, password):
        self.user = user.encode()
        self.password = password.encode()

    def __call__(self, server, session, envelope, mechanism, auth_data):
        if not isinstance(auth_data, LoginPassword):
            return AuthResult(success=False, handled=False)
        if auth_data.login == self.user and auth_data.password == self.password:
            session.sink_auth = [mechanism, auth_data.login.decode()]
            return AuthResult(success=True)
        return AuthResult(success=False, handled=False)


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--tls-cert")
    parser.add_argument("--tls-key")
    parser.add_argument("--implicit-tls", action="store_true")
    parser.add_argument("--require-starttls", action="store_true")
    parser.add_argument("--auth")
    parser.add_argument("--auth-mechanisms", default="PLAIN,LOGIN")
    parser.add_argument("--auth-plaintext", action="store_true")
    options = parser.parse_args()

    context = None
    if options.tls_cert:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(options.tls_cert, options.tls_key)

    parameters = {"hostname": "sink.test", "decode_data": False, "timeout": 30}
    if context is not None and not options.implicit_tls:
        parameters["tls_context"] = context
        parameters["require_starttls"] = options.require_starttls
    if options.auth:
        user, _, password = options.auth.partition(":")
        offered = {m.strip().upper() for m in options.auth_mechanisms.split(",") if m.strip()}
        parameters["authenticator"] = Authenticator(user, password)
        parameters["auth_required"] = True
        parameters["auth_exclude_mechanism"] = [m for m in ("PLAIN", "LOGIN") if m not in offered]
        # aiosmtpd counts only STARTTLS as TLS; an implicit-TLS connection is encrypted too.
        parameters["auth_require_tls"] = not (options.auth_plaintext or options.implicit_tls)

    loop = asyncio.get_running_loop()
    sink = Sink(options.dir)
    server = await loop.create_server(
        lambda: SMTP(sink, loop=loop, **parameters),
        host=options.host,
        port=options.port,
        ssl=context if options.implicit_tls else None,
    )
    port = server.sockets[0].getsockname()[1]
    print(f"ready {port}", flush=True)

    # Run until stdin closes (the parent ended or closed the pipe).
    stdin_closed = loop.create_future()

    def read_stdin():
        if not os.read(sys.stdin.fileno(), 4096):
            loop.remove_reader(sys.stdin.fileno())
            stdin_closed.set_result(None)

    loop.add_reader(sys.stdin.fileno(), read_stdin)
    await stdin_closed
    server.close()


if __name__ == "__main__":
    asyncio.run(main())
