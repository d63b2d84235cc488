#!/usr/bin/env bash
# Debian's headless Chromium and its driver for the dashboard's browser test
# (tests/test_dashboard_browser.py, docs/decisions/0045), installed when missing.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "make test: installing chromium and chromium-driver (apt-get) for the browser test" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium chromium-driver
