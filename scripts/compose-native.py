#!/usr/bin/env python3
"""Runs docker-compose.yml's own trunk-sync commands natively, so the file cannot drift
from the binary (there is no Docker engine on the test machines).

    compose-native.py [--override FILE]... [--project-directory DIR] [--keys-add]
                      COMPOSE_FILE ENV_FILE TRUNK_SYNC_BINARY PORT

Interpolates the compose file (and each --override file, on its own, as Compose does
before it merges them) as Compose 2.24 does: ${VAR}, ${VAR:-default}, ${VAR-default},
${VAR:?error}, ${VAR?error}, $$, nested in defaults, from the environment and ENV_FILE. A
default is interpolated whether it is used or not, as Compose did until 2026: a required
variable inside a default is required even when the variable before it is set. Merges the
overrides in (mappings by key, lists appended, command and entrypoint replaced); a secret a
service names (`secrets:`) is mounted at /run/secrets/NAME in a container: natively, an
environment value naming that path is pointed at the secret's `file` (relative to
--project-directory, the compose file's directory unless given). Then:
1. runs `config check` and then the `migrate` service's command with its environment
   (env_file included) and expects exit 0 from each; with --keys-add, then `keys add` in
   the migrate service (`docker compose run --rm migrate keys add`), so that serve starts
   with a signing key it must decrypt;
2. starts the `trunk-sync` service's command with its env_file and environment (its
   port moved to PORT and its admin port to any free one, since the container's ports may
   be taken here; the admin port must be published on loopback only), checks that no
   value of that environment holds the owner's password (POSTGRES_PASSWORD, or the one in
   the migrate service's TRUNK_SYNC_MIGRATION_DATABASE_URL), waits until
   its own healthcheck command succeeds, then sends SIGTERM and expects exit 0 and no
   warning about its database role (superuser, owner) in its log.
Prints "ok ..." per step (and migrate's output); exits 1 with the reason otherwise.
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse

import yaml

parser = argparse.ArgumentParser()
parser.add_argument("--override", action="append", default=[])
parser.add_argument("--project-directory")
parser.add_argument("--keys-add", action="store_true")
parser.add_argument("compose_path")
parser.add_argument("env_path")
parser.add_argument("binary")
parser.add_argument("port")
arguments = parser.parse_args()
compose_path, env_path, binary, port = arguments.compose_path, arguments.env_path, arguments.binary, arguments.port
project_directory = arguments.project_directory or os.path.dirname(os.path.abspath(compose_path))


def read_env_file(path):
    values = {}
    with open(path) as handle:
        for line in handle:
            line = line.strip()
            if not line or line.startswith("#") or "=" not in line:
                continue
            key, value = line.split("=", 1)
            values[key.strip()] = value.strip()
    return values


file_env = read_env_file(env_path)
variables = dict(file_env)
variables.update(os.environ)  # the shell's variables win over .env, as in Compose

name_pattern = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def closing_brace(text, start):
    """The index of the } that closes the ${ at start."""
    depth, index = 0, start
    while index < len(text):
        if text.startswith("${", index):
            depth, index = depth + 1, index + 2
            continue
        if text[index] == "}":
            depth -= 1
            if depth == 0:
                return index
        index += 1
    raise SystemExit(f"compose: an unclosed ${{ in {text!r}")


def substitute(body):
    """The value of one ${...}: NAME, then nothing or an operator and its argument."""
    match = name_pattern.match(body)
    if not match:
        raise SystemExit(f"compose: invalid interpolation ${{{body}}}")
    name, rest = match.group(0), body[match.end():]
    value = variables.get(name)
    if not rest:
        return value if value is not None else ""
    operator = next((op for op in (":-", "-", ":?", "?") if rest.startswith(op)), None)
    if operator is None:
        raise SystemExit(f"compose: unsupported interpolation ${{{body}}}")
    argument = interpolate(rest[len(operator):])  # before looking at the value: see above
    empty = value is None or (operator.startswith(":") and value == "")
    if operator.endswith("-"):
        return argument if empty else value
    if empty:
        raise SystemExit(f"compose: {name}: {argument}")
    return value


def interpolate(text):
    out, index = [], 0
    while index < len(text):
        if text.startswith("$$", index):
            out.append("$")
            index += 2
        elif text.startswith("${", index):
            end = closing_brace(text, index)
            out.append(substitute(text[index + 2:end]))
            index = end + 1
        elif text[index] == "$" and name_pattern.match(text, index + 1):
            match = name_pattern.match(text, index + 1)
            out.append(variables.get(match.group(0)) or "")
            index = match.end()
        else:
            out.append(text[index])
            index += 1
    return "".join(out)


def walk(node):
    if isinstance(node, dict):
        return {key: walk(value) for key, value in node.items()}
    if isinstance(node, list):
        return [walk(value) for value in node]
    if isinstance(node, str):
        return interpolate(node)
    return node


def merge(base, override, key=None):
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for name, value in override.items():
            merged[name] = merge(base[name], value, name) if name in base else value
        return merged
    if isinstance(base, list) and isinstance(override, list) and key not in ("command", "entrypoint"):
        return base + [value for value in override if value not in base]
    return override


with open(compose_path) as handle:
    compose = walk(yaml.safe_load(handle))
for path in arguments.override:
    with open(path) as handle:
        compose = merge(compose, walk(yaml.safe_load(handle)))
services = compose["services"]


def environment(service):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp")}
    for entry in service.get("env_file", []):
        path = entry["path"] if isinstance(entry, dict) else entry
        env.update(read_env_file(os.path.join(os.path.dirname(compose_path), path) if path != ".env" else env_path))
    declared = service.get("environment", {})
    if isinstance(declared, list):
        declared = dict(item.split("=", 1) for item in declared)
    env.update({key: str(value) for key, value in declared.items()})
    for entry in service.get("secrets", []):
        name = entry if isinstance(entry, str) else entry["source"]
        target = name if isinstance(entry, str) else entry.get("target", name)
        mounted = target if target.startswith("/") else "/run/secrets/" + target
        definition = compose.get("secrets", {}).get(name)
        if not definition or "file" not in definition:
            raise SystemExit(f"compose: service uses secret {name!r}, which is not defined with a file")
        source = os.path.join(project_directory, definition["file"])
        env = {key: value.replace(mounted, source) if value.startswith(mounted) else value for key, value in env.items()}
    return env


migrate = services["migrate"]
# The README's first command: `docker compose run --rm --no-deps migrate config check`, in
# the migrate service's environment (.env included), must find nothing to refuse.
result = subprocess.run([binary, "config", "check"], env=environment(migrate), capture_output=True, text=True, timeout=60)
if result.returncode != 0:
    raise SystemExit(f"config check in the migrate service refused ({result.returncode}): {result.stderr.strip()}")
print("ok config check in the migrate service", flush=True)
result = subprocess.run([binary] + migrate["command"], env=environment(migrate), capture_output=True, text=True, timeout=120)
if result.returncode != 0:
    raise SystemExit(f"migrate failed ({result.returncode}): {result.stderr.strip()}")
for line in result.stdout.strip().splitlines():
    print("migrate:", line, flush=True)
print("ok migrate", flush=True)
if arguments.keys_add:
    result = subprocess.run([binary, "keys", "add"], env=environment(migrate), capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise SystemExit(f"keys add in the migrate service failed ({result.returncode}): {result.stderr.strip()}")
    print("ok keys add in the migrate service", flush=True)

server = services["trunk-sync"]
assert server["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
env = environment(server)
# Configuration only through TRUNK_SYNC_* variables: no flags, no config file.
assert server["command"] == ["serve"] and migrate["command"] == ["migrate"], "commands take no flags"
assert any(key.startswith("TRUNK_SYNC_") for key in env)
env["TRUNK_SYNC_PORT"] = port
# The operator listener (the console) is published on the host's loopback only.
published = [str(entry) for entry in server.get("ports", [])]
admin = [entry for entry in published if entry.endswith(":9090")]
assert admin == ["127.0.0.1:9090:9090"], f"admin port must be published on loopback only: {published}"
print("ok the console is published on 127.0.0.1:9090 only", flush=True)
assert env.get("TRUNK_SYNC_ADMIN_PORT") == "9090", "the admin listener's port is set"
env["TRUNK_SYNC_ADMIN_PORT"] = "0"  # any free port: 9090 may be taken here
owner_password = variables.get("POSTGRES_PASSWORD", "")
assert owner_password, "POSTGRES_PASSWORD is set"
# The owner's URL as migrate gets it (built from POSTGRES_*, or written in ENV_FILE): its
# password too.
owner_url = environment(migrate).get("TRUNK_SYNC_MIGRATION_DATABASE_URL", "")
owner_secrets = [owner_password, urllib.parse.urlsplit(owner_url).password or ""]
leaks = [key for key, value in env.items() if any(secret and secret in value for secret in owner_secrets)]
if leaks:
    raise SystemExit(f"the server's environment holds the owner's password in {leaks}")
print("ok serve's environment holds no owner password", flush=True)
process = subprocess.Popen([binary] + server["command"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
check = [part.replace(":8080/", f":{port}/") for part in server["healthcheck"]["test"][1:]]
deadline = time.time() + 30
healthy = False
while time.time() < deadline and process.poll() is None:
    if subprocess.run(check, capture_output=True, timeout=10).returncode == 0:
        healthy = True
        break
    time.sleep(0.1)
if not healthy:
    process.kill()
    raise SystemExit("serve never became healthy: " + (process.stderr.read() if process.stderr else ""))
print("ok serve is healthy by its compose healthcheck", flush=True)
process.send_signal(signal.SIGTERM)
code = process.wait(timeout=20)
log = process.stderr.read() if process.stderr else ""
if code != 0:
    raise SystemExit(f"serve exited with {code} after SIGTERM: {log}")
print("ok serve stopped cleanly on SIGTERM", flush=True)
if "TRUNK_SYNC_DATABASE_URL logs in as" in log:
    raise SystemExit("serve warned about its database role: " + log)
print("ok serve's database role is neither superuser nor owner", flush=True)
