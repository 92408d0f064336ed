#!/usr/bin/env bash
# The H200 reference run: `make report`'s full profile, every chapter through papermill, without the
# book build (jupyter-book is not on that machine; the book is built here from the run folder).
# Usage there: FP4LAB_GIT_SHA=<sha> bash benchmarks/h200_full_report.sh   (the tree travels without .git)
source benchmarks/device_setup.sh
set -o pipefail
RUN_ID=${RUN_ID:-$(date -u +%Y%m%dT%H%M%SZ)-h200-full}
mkdir -p "$OUT/runs"
start=$(date +%s)
timeout ${REPORT_TIMEOUT_S:-540} python3 -m fp4lab report --profile full --runs-dir "$OUT/runs" --run-id "$RUN_ID" --no-build 2>&1 \
    | grep --line-buffered -v -e "Executing:" -e "IPKernelApp" | tee "$OUT/report.log"
status=${PIPESTATUS[0]}
echo "report: $(( $(date +%s) - start )) s, exit $status"
tar -czf "$OUT/$RUN_ID.tgz" -C "$OUT/runs" "$RUN_ID" && rm -rf "$OUT/runs"
