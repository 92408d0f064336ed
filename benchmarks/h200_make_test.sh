#!/usr/bin/env bash
# On the H200: `make setup` offline from carried wheels, then `make test` (xdist, CUDA tests included).
# Usage: bash benchmarks/h200_make_test.sh <commit>   (carry .whl/report and .whl/fp4libs)
set -u
export PIP_NO_INDEX=1 PIP_FIND_LINKS="$PWD/.whl/report $PWD/.whl/fp4libs" FP4LAB_GIT_SHA=$1
s=$(date +%s)
make setup > $OUT/setup.log 2>&1; echo "make setup: exit $? after $(( $(date +%s) - s )) s" | tee -a $OUT/setup.log
tail -5 $OUT/setup.log
left=$(( ${LIMIT_S:-500} - ($(date +%s) - s) ))
PYTEST_ADDOPTS="-n 12 -q -p no:cacheprovider" timeout $left make test > $OUT/make-test.log 2>&1; echo "make test: exit $? after $(( $(date +%s) - s )) s" | tee -a $OUT/make-test.log
tail -25 $OUT/make-test.log
