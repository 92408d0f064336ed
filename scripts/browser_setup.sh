#!/usr/bin/env bash
# What `make browser-check` needs beyond the venv: Debian's chromium and chromedriver (installed
# with apt-get only when missing) and the project's `browser` extra (selenium, only when missing).
# Says what it installs and where. Exit 4 (setup failed) when it cannot install something.
#   VENV       the venv (default .venv)
#   CHROMIUM / CHROMEDRIVER   where tests/test_browser.py looks (default /usr/bin/chromium, /usr/bin/chromedriver)
set -euo pipefail

VENV=${VENV:-.venv}
CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
CHROMEDRIVER=${CHROMEDRIVER:-/usr/bin/chromedriver}
PY="$VENV/bin/python"
CONSTRAINTS="$VENV/fp4lab-constraints.txt"

say() { echo "==> browser-check: $*"; }
die() { echo "browser-check: error: $*" >&2; exit 4; }

if [ -x "$CHROMIUM" ] && [ -x "$CHROMEDRIVER" ]; then
    say "chromium and chromedriver present ($CHROMIUM, $CHROMEDRIVER)"
else
    command -v apt-get >/dev/null 2>&1 || die "$CHROMIUM or $CHROMEDRIVER missing and no apt-get here:" \
                                              "install Chromium and its chromedriver at those paths"
    if [ "$(id -u)" = 0 ]; then
        as_root=()
    elif command -v sudo >/dev/null 2>&1; then
        as_root=(sudo)
    else
        die "$CHROMIUM or $CHROMEDRIVER missing: run as root (or with sudo) so apt-get can install chromium chromium-driver"
    fi
    say "installing Debian's chromium and chromium-driver with ${as_root[*]:+sudo }apt-get (into /usr/bin)"
    "${as_root[@]}" apt-get update -qq || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq chromium chromium-driver >/dev/null \
        || die "apt-get install chromium chromium-driver failed"
    [ -x "$CHROMIUM" ] && [ -x "$CHROMEDRIVER" ] || die "apt-get installed chromium but $CHROMIUM or $CHROMEDRIVER is still missing"
fi

if "$PY" -c "import selenium" 2>/dev/null; then
    say "selenium present in $VENV"
else
    say "installing the browser extra (selenium) into $VENV"
    constraint=()
    [ -f "$CONSTRAINTS" ] && constraint=(-c "$CONSTRAINTS")   # keeps setup's torch build
    "$PY" -m pip -q --disable-pip-version-check install "${constraint[@]}" -e ".[browser]" \
        || die "pip could not install the browser extra (selenium)"
fi
