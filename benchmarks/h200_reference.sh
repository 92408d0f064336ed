#!/usr/bin/env bash
# The H200 reference run as a user runs it: `make report` (setup from carried wheels, every chapter
# through papermill, the book built), offline. Carry `.whl/report` and `.whl/fp4libs`; the tree
# travels without .git, so pass the commit: FP4LAB_GIT_SHA=<sha> bash benchmarks/h200_reference.sh
# A run folder carried under runs/$RUN_ID is resumed: the chapters measure only what it lacks.
# Writes under $OUT: $RUN_ID.tgz (the run folder), book-html.tgz, make-report.log, setup logs.
set -u
RUN_ID=${RUN_ID:-$(date -u +%Y%m%dT%H%M%SZ)-h200-full}
LIMIT_S=${REPORT_TIMEOUT_S:-540}
mkdir -p "$OUT/runs"
[ -d "runs/$RUN_ID" ] && cp -r "runs/$RUN_ID" "$OUT/runs/"
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.sm,clocks.max.sm --format=csv,noheader
export PIP_NO_INDEX=1 PIP_FIND_LINKS="$PWD/.whl/report $PWD/.whl/fp4libs" PYTHONUNBUFFERED=1
start=$(date +%s)
timeout -k 20 "$LIMIT_S" make report REPORT_PROFILE=full RUN_ID="$RUN_ID" RUNS_DIR="$OUT/runs" 2>&1 \
    | grep --line-buffered -v -e "Executing:" -e "IPKernelApp" | tee "$OUT/make-report.log"
status=${PIPESTATUS[0]}
echo "make report: $(( $(date +%s) - start )) s, exit $status" | tee -a "$OUT/make-report.log"
if [ ! -f .venv/.fp4lab-installed ]; then
    # setup itself failed (the log says why): measure anyway, the way calls 1-7 ran fp4lab
    left=$(( LIMIT_S - ($(date +%s) - start) ))
    echo "fallback: setup failed; python3 -m fp4lab report with the wheels on PYTHONPATH ($left s left)" \
        | tee -a "$OUT/make-report.log"
    if [ -x .venv/bin/python ] && [ -f .venv/fp4lab-constraints.txt ]; then   # why setup failed, for NOTES
        timeout 60 .venv/bin/python -m pip install -v -c .venv/fp4lab-constraints.txt --no-build-isolation \
            -e ".[test]" > "$OUT/setup-debug.log" 2>&1
    fi
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/report/*.whl .whl/fp4libs/*.whl
    export PYTHONPATH="$PWD/src:/tmp/site" JUPYTER_PATH=/tmp/jupyter/share/jupyter PATH="/tmp/site/bin:$PATH"
    python3 -m ipykernel install --prefix /tmp/jupyter --name fp4lab --display-name "Python (fp4lab)" >/dev/null
    timeout -k 20 "$left" python3 -m fp4lab report --profile full --runs-dir "$OUT/runs" --run-id "$RUN_ID" 2>&1 \
        | grep --line-buffered -v -e "Executing:" -e "IPKernelApp" | tee -a "$OUT/make-report.log"
    status=${PIPESTATUS[0]}
    echo "fallback report: $(( $(date +%s) - start )) s, exit $status" | tee -a "$OUT/make-report.log"
fi
tail -n 3 .venv/fp4lab-gpu-*.log > "$OUT/setup-gpu-extra.log" 2>/dev/null
[ -d "$OUT/runs/$RUN_ID" ] && tar -czf "$OUT/$RUN_ID.tgz" -C "$OUT/runs" "$RUN_ID"
[ -f book/_build/html/index.html ] && tar -czf "$OUT/book-html.tgz" -C book/_build html
rm -rf "$OUT/runs"
exit "$status"
