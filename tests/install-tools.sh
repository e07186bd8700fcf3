#!/usr/bin/env bash
# Test-only tools: PyPI packages into the venv, Debian packages where apt-get works.
set -euo pipefail
pip="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
cd "$(dirname "$0")"
"$pip" install -q -r requirements.txt
pkgs=$(cat apt.txt */apt.txt 2>/dev/null | sed 's/#.*//' | xargs)
missing=""
for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
  elif command -v sudo >/dev/null; then
    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
  else
    echo "cannot install Debian packages ($missing): tests that need them will skip" >&2
  fi
fi
