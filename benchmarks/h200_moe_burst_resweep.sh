#!/usr/bin/env bash
# One device call (H200 only; forty-seventh session): the reference run's MoE rows that met the
# power cap inside their timed burst, re-measured with the profile's `max_burst_ms` (a burst cut
# to end before the cap's onset, so it times the boost clock like every other row). A row is
# re-measured where its burst ran past 45 ms (so the cut applies to it) and either the SM clock
# around it averaged under 97% of the maximum, or it is fp4lab's fused MoE (cuda-w4a16-moe: the
# point that draws most and whose clock fell in most of its rows). Rows whose burst held the
# maximum clock are kept: a shorter burst at the same clock times the same call.
# The run folder comes back as $OUT/run.tgz and the log as $OUT/sweep.log, after each step.
#   carry: .whl/fp4libs       run: bash benchmarks/h200_moe_burst_resweep.sh <full commit>
set -u
export PYTHONUNBUFFERED=1 FP4LAB_GIT_SHA=$1 HUMMING_CACHE_DIR=/tmp/humming-cache
start=$(date +%s); REFERENCE=results/reference/20261203T1155Z-h200-full
RUN=/tmp/runs/$(basename $REFERENCE)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
case "$gpu" in *H200*) ;; *) echo "not an H200: nothing to do"; exit 0;; esac
cp "$0" $OUT/
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/fp4libs/*.whl
mkdir -p /tmp/runs && cp -r $REFERENCE /tmp/runs/
bring_back() {
    # written aside, then renamed: a call stopped at its limit mid-write keeps the last whole one
    tar -C /tmp/runs -czf /tmp/run.tgz $(basename $RUN) && mv /tmp/run.tgz $OUT/run.tgz
}
# one sweep a line: preset, EP, batches, methods (moe_burst_rows.py: no point the run never held)
PYTHONPATH=src python3 benchmarks/moe_burst_rows.py $RUN --drop > /tmp/sweeps.txt; cat /tmp/sweeps.txt
while read -r preset ep batches methods; do
    PYTHONPATH=src:/tmp/site timeout -k 5 200 python3 -m fp4lab moe-sweep --profile full --preset $preset \
        --ep $ep --batch ${batches//,/ } --methods ${methods//,/ } --max-burst-ms ${BURST_MS:-50} \
        --runs-dir /tmp/runs --run-id $(basename $RUN) --quiet >> $OUT/sweep.log 2>&1 < /dev/null
    echo "moe-sweep $preset EP $ep B $batches $methods: exit $? after $(( $(date +%s) - start )) s"
    bring_back
done < /tmp/sweeps.txt
PYTHONPATH=src python3 benchmarks/moe_burst_rows.py $RUN --show
