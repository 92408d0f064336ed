#!/usr/bin/env bash
# One device call (H200 only): is the reference run's GLM-5 B = 512 time of cuda-w4a16-moe a
# property of the kernel or of the moment's SM clock, and does a timed burst shorter than the power
# cap's onset give the kernel's boost-clock time? (Forty-fifth session: the re-sweep gave NVFP4 a
# median of 1.93 ms at a mean clock of 1792 MHz, its 20th percentile 1.70 ms, and MXFP4 1.61 ms at
# 1980 MHz: the point draws ~710-740 W against the 700 W limit and the clock falls within the
# timer's ~0.1 s burst.)
#  1. `moe_clock_probe.py` in both formats from 3 s of rest: when the sustained call brings the SM
#     clock down (the H100 said 0.08-0.10 s, calls 109-110 and 159; never read on the H200);
#  2. REPEATS rounds of the A/B: GLM-5 B = 256, 512, 2048 (EP 1, both formats) swept with the
#     profile's timer (30 replays) and with `--max-burst-ms $BURST_MS`, the order alternating per
#     round, each row keeping the clock read before and after its burst;
#  3. DeepSeek-V3 B = 512 once in each mode.
# Every sweep's rows go to $W/repeats.jsonl tagged with round and mode, then are dropped from their
# run folder so the next sweep measures them again. The lot comes back as $OUT/repeats.tgz,
# rewritten after each step.
#   carry: .whl/fp4libs       run: bash benchmarks/h200_moe_repeat.sh <full commit>
#   REPEATS=2 rounds, BURST_MS=50 the capped mode's burst, BUDGET_S=360 no new step after that many s
set -u
export PYTHONUNBUFFERED=1 FP4LAB_GIT_SHA=$1 HUMMING_CACHE_DIR=/tmp/humming-cache
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
case "$gpu" in *H200*) ;; *) echo "not an H200: nothing to do"; exit 0;; esac
cp "$0" $OUT/
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/fp4libs/*.whl
start=$(date +%s); W=/tmp/repeats; mkdir -p $W
BURST_MS=${BURST_MS:-50}
bring_back() {
    # written aside, then renamed: a call stopped at its limit keeps the last whole one
    tar -C $W -czf /tmp/repeats.tgz . && mv /tmp/repeats.tgz $OUT/repeats.tgz
}
in_budget() { [ $(( $(date +%s) - start )) -lt ${BUDGET_S:-360} ]; }
for fmt in nvfp4 mxfp4; do
    PYTHONPATH=src:/tmp/site timeout -k 5 120 python3 benchmarks/moe_clock_probe.py --out $W/clock-$fmt \
        --fmt $fmt --seconds 4 --rest-s 3 --methods cuda-w4a16-moe 2>&1 | tail -8
    echo "clock probe $fmt: exit ${PIPESTATUS[0]} at $(( $(date +%s) - start )) s"
    bring_back
done
# sweep <round> <mode> <moe-sweep args...>: one sweep into run-<mode>, its rows appended and dropped
sweep() {
    local round=$1 mode=$2; shift 2
    local burst=(); [ $mode = profile ] || burst=(--max-burst-ms $BURST_MS)
    PYTHONPATH=src:/tmp/site timeout -k 5 200 python3 -m fp4lab moe-sweep "$@" --ep 1 \
        --fmts nvfp4 mxfp4 --methods cuda-w4a16-moe --anatomy-batch "${burst[@]}" --runs-dir $W \
        --run-id run-$mode --quiet >> $W/sweep.log 2>&1
    echo "round $round $mode $*: exit $? at $(( $(date +%s) - start )) s"
    PYTHONPATH=src python3 -c "
import json, sys
from fp4lab import schema
from fp4lab.results import RunDir
run = RunDir.open(sys.argv[1])
rows = [r for r in run.read_rows('moe') if r['method'] == 'cuda-w4a16-moe']
with open(sys.argv[2], 'a') as out:
    for r in rows:
        out.write(json.dumps({'round': int(sys.argv[3]), 'mode': sys.argv[4], **r}, default=str) + '\n')
        print(f\"  {r['preset']} {r['fmt']} B={r['batch']} {r['status']}: median {r['median_us']} us \"
              f\"(p20 {r['p20_us']}, p80 {r['p80_us']}, {r['samples']} replays), \"
              f\"{r['sm_clock_start_mhz']} -> {r['sm_clock_end_mhz']} MHz; \"
              f\"window {r['avg_power_w']} W, {r['window_sm_clock_mhz']} MHz\")
run.drop_rows('moe', {schema.TABLES['moe'].row_key(r) for r in rows})
" $W/run-$mode $W/repeats.jsonl $round $mode
    bring_back
}
for round in $(seq 1 ${REPEATS:-2}); do
    modes="profile burst"; [ $(( round % 2 )) -eq 1 ] || modes="burst profile"
    for mode in $modes; do
        in_budget || break 2
        sweep $round $mode --preset glm-5 --batch 256 512 2048
    done
done
for mode in burst profile; do
    in_budget || break
    sweep 1 $mode --preset deepseek-v3 --batch 512
done
echo "done at $(( $(date +%s) - start )) s"
