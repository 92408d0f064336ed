#!/usr/bin/env bash
# On the H200: `make setup` offline from carried wheels, then `make test` (xdist, CUDA tests included).
# Usage: LIMIT_S=540 bash benchmarks/h200_make_test.sh <commit>   (carry .whl/report and .whl/fp4libs)
# The time limit sends SIGINT, not SIGTERM: pytest then still prints its short summary (-rfE names
# every failure and error so far) and writes junit.xml, so a run cut short says what failed.
set -u
export PIP_NO_INDEX=1 PIP_FIND_LINKS="$PWD/.whl/report $PWD/.whl/fp4libs" FP4LAB_GIT_SHA=$1
s=$(date +%s)
make setup > $OUT/setup.log 2>&1; echo "make setup: exit $? after $(( $(date +%s) - s )) s" | tee -a $OUT/setup.log
tail -5 $OUT/setup.log
df -h /tmp . > $OUT/disk-before.txt 2>&1
left=$(( ${LIMIT_S:-500} - ($(date +%s) - s) ))
PYTEST_ADDOPTS="-n 15 -q -rfE --tb=line --durations=15 -p no:cacheprovider --junitxml=$OUT/junit.xml" \
    timeout -s INT -k 30 $left make test > $OUT/make-test.log 2>&1
echo "make test: exit $? after $(( $(date +%s) - s )) s" | tee -a $OUT/make-test.log
df -h /tmp . > $OUT/disk-after.txt 2>&1
nvidia-smi --query-gpu=memory.used,memory.total --format=csv >> $OUT/disk-after.txt 2>&1
grep -v -e PytestBenchmarkWarning -e "warner(" $OUT/make-test.log | tail -40
