#!/usr/bin/env bash
# Installs the Debian packages trunk-sync needs to build, run and test, and any named as
# arguments, skipping those present.
set -euo pipefail

# Swift is no Debian package: without it, say where to get it, rather than fail later in
# `swift build` with "command not found" (make run with TRUNK_SYNC_BIN builds nothing).
if [ $# -eq 0 ] && [ -z "${TRUNK_SYNC_BIN:-}" ] && ! command -v swift >/dev/null; then
  echo "swift is not on PATH: trunk-sync builds with Swift 6 (6.3 tested). Install the Swift toolchain for" \
    "Debian 12 (https://www.swift.org/install/linux/), put its usr/bin on PATH, then run this again." >&2
  exit 1
fi

# With arguments: those packages instead (scripts/test.sh adds the browser its tests drive).
packages=(libpq-dev libssl-dev pkg-config postgresql python3-aiosmtpd python3-jwt python3-venv curl openssl)
[ $# -gt 0 ] && packages=("$@")
missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "installing: ${missing[*]}" >&2
sudo=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "missing packages (${missing[*]}) and no sudo: install them as root" >&2; exit 1; }
  sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
# Debian's postgresql package would start a system-wide cluster; ours are private, so stop it.
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
if command -v pg_lsclusters >/dev/null && pg_lsclusters -h 2>/dev/null | grep -q online; then
  "${sudo[@]}" pg_ctlcluster --force "$(pg_lsclusters -h | awk '/online/{print $1; exit}')" main stop 2>/dev/null || true
fi
