#!/usr/bin/env bash
# On the H200: `make setup` offline from carried wheels, then `make test` (xdist, CUDA tests included).
# Usage: LIMIT_S=540 [WORKERS=15] [TEST_TIMEOUT_S=600] bash benchmarks/h200_make_test.sh <commit>
#        (carry .whl/report and .whl/fp4libs)
# The time limit sends SIGINT, not SIGTERM: pytest then still prints its short summary (-rfE names
# every failure and error so far), the slowest tests, and writes junit.xml, so a run cut short says
# what failed. A monitor records disk, GPU memory and process counts every 15 s (monitor.txt).
# `--dist worksteal`: an idle worker takes queued tests from a busy one, so one long test does not
# hold up the tests queued behind it (call 18: five waited behind the slowest); `-p no:benchmark`
# silences the image's pytest-benchmark, which warns once per worker under xdist.
set -u
export PIP_NO_INDEX=1 PIP_FIND_LINKS="$PWD/.whl/report $PWD/.whl/fp4libs" FP4LAB_GIT_SHA=$1
s=$(date +%s)
make setup > $OUT/setup.log 2>&1; echo "make setup: exit $? after $(( $(date +%s) - s )) s" | tee -a $OUT/setup.log
tail -5 $OUT/setup.log
( while sleep 15; do
    echo "t=$(( $(date +%s) - s )) s  tmp=$(df --output=used,avail -h /tmp | tail -1)  procs=$(ps -e --no-headers | wc -l)" \
         "gpu=$(nvidia-smi --query-gpu=memory.used,utilization.gpu,clocks.sm --format=csv,noheader 2>&1)"
  done > $OUT/monitor.txt 2>&1 ) &
monitor=$!
left=$(( ${LIMIT_S:-500} - ($(date +%s) - s) ))
PYTEST_ADDOPTS="-n ${WORKERS:-15} --dist worksteal -p no:benchmark -q -rfE --tb=short --durations=40 -p no:cacheprovider -o timeout=${TEST_TIMEOUT_S:-600} --junitxml=$OUT/junit.xml" \
    timeout -s INT -k 30 $left make test > $OUT/make-test.log 2>&1
echo "make test: exit $? after $(( $(date +%s) - s )) s" | tee -a $OUT/make-test.log
kill $monitor 2>/dev/null
df -h /tmp . > $OUT/disk-after.txt 2>&1
nvidia-smi --query-gpu=memory.used,memory.total --format=csv >> $OUT/disk-after.txt 2>&1
grep -v -e PytestBenchmarkWarning -e "warner(" $OUT/make-test.log | tail -60
