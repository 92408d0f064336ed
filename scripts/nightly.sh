#!/usr/bin/env bash
# The nightly job on a GPU box (cron or a self-hosted CI runner, README "Nightly"): set up, run the
# report into a runs folder that is kept from night to night, write the share file, publish both,
# and exit with a status the caller alerts on. Knobs (environment):
#   RUNS_DIR        where run folders accumulate (default runs). Keep it: chapter 05 and exit status
#                   3 compare tonight's run with the previous one in this folder.
#   PUBLISH_DIR     where the book and the share file are published (default: unset, they stay in
#                   book/_build/html and share/): PUBLISH_DIR/book/ (tonight's, replaced whole) and
#                   PUBLISH_DIR/share/<run-id>-diagnosis.html (one per night, kept)
#   REPORT_PROFILE  auto (default: full where torch sees a GPU) | smoke | full
#   RUN_ID          default <UTC time>-nightly
#   VENV and the Makefile's setup knobs (TORCH_SPEC, TORCH_INDEX_URL, SETUP_DEVICE) pass to make setup.
# Exit status:
#   0 ok; 1 a chapter, the book or the share file failed (the book is still published: its front
#   page lists the failure); 2 bad arguments; 3 a regression against the previous run on the same
#   device; 4 setup failed (make setup: scripts/setup_env.sh's own status is in make's "Error N"
#   line); 130 interrupted by Ctrl-C (SIGTERM or SIGHUP kill the report: 143, 129).
# It calls the report with the venv's python, not `make report`: make exits 2 for every failing
# recipe, whatever the recipe's own status was.
set -uo pipefail
cd "$(dirname "$0")/.."

RUNS_DIR=${RUNS_DIR:-runs}
PUBLISH_DIR=${PUBLISH_DIR:-}
REPORT_PROFILE=${REPORT_PROFILE:-auto}
RUN_ID=${RUN_ID:-$(date -u +%Y%m%dT%H%M%SZ)-nightly}
VENV=${VENV:-.venv}
PY="$VENV/bin/python"
EXIT_FAILED=1 EXIT_SETUP=4

say() { echo "==> nightly: $*"; }

publish() {   # the book of tonight's run and its share file
    local share_file="share/$RUN_ID-diagnosis.html"
    "$PY" -m fp4lab share --run-id "$RUN_ID" --runs-dir "$RUNS_DIR" --out-dir share || return 1
    [ -n "$PUBLISH_DIR" ] || { say "book in book/_build/html, share file $share_file"; return 0; }
    mkdir -p "$PUBLISH_DIR/share" || return 1
    rm -rf "$PUBLISH_DIR/book.new" && cp -r book/_build/html "$PUBLISH_DIR/book.new" || return 1
    rm -rf "$PUBLISH_DIR/book" && mv "$PUBLISH_DIR/book.new" "$PUBLISH_DIR/book" || return 1
    cp "$share_file" "$PUBLISH_DIR/share/" || return 1
    say "published $PUBLISH_DIR/book/index.html and $PUBLISH_DIR/share/$(basename "$share_file")"
}

say "run $RUN_ID into $RUNS_DIR (profile $REPORT_PROFILE)"
make setup VENV="$VENV" || { echo "nightly: setup failed: exit status $EXIT_SETUP" >&2; exit $EXIT_SETUP; }
"$PY" -m fp4lab report --profile "$REPORT_PROFILE" --runs-dir "$RUNS_DIR" --run-id "$RUN_ID"
status=$?
case $status in
    0|1|3)   # a run folder and a book exist: publish them, whatever the verdict
        if ! publish; then
            echo "nightly: publishing the book or the share file failed" >&2
            [ "$status" != 0 ] || status=$EXIT_FAILED
        fi ;;
esac
say "exit status $status"
exit $status
