#!/usr/bin/env bash
# What the test suite needs beyond pip packages, on a fresh Debian machine (run as root):
# - PostgreSQL at 127.0.0.1:5432 (database test, trust auth): started by this kind of machine; start it
#   if it stopped.
# - Chromium for the browser tests: Debian's package (/usr/bin/chromium), driven by Playwright from the
#   test extra; `playwright install` is never run (no browser download).
set -euo pipefail
if command -v pg_isready >/dev/null && ! pg_isready -q -h 127.0.0.1 -p 5432; then
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start || true
fi
if [ ! -x /usr/bin/chromium ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq chromium >/dev/null
fi
