#!/usr/bin/env bash
# One device call (H200 only; forty-fifth session): is the reference run's GLM-5 B = 512 time of
# cuda-w4a16-moe a property of the kernel or of the moment's SM clock? The re-sweep (call of
# 2026-12-07 18:55) gave NVFP4 a median of 1.93 ms at 1792 MHz, its 20th percentile 1.70 ms, and
# MXFP4 1.61 ms at 1980 MHz: the point draws ~710-740 W, at the 700 W limit, and the clock falls
# within the timer's burst. Here the same point, both formats, is swept REPEATS times into fresh
# run folders (not the reference run), alternating the formats, each sweep's rows with their
# median, percentiles and SM clock. The folders come back as $OUT/repeats.tgz.
# Forty-sixth session: the rows now keep the clock read before and after the burst, and the
# sweeps follow `moe_clock_probe.py` in both formats: from 3 s of rest, when the sustained call
# brings the SM clock down (the H100 said 0.08-0.10 s, calls 109-110; never read on the H200).
#   carry: .whl/fp4libs       run: bash benchmarks/h200_moe_repeat.sh <full commit>
set -u
export PYTHONUNBUFFERED=1 FP4LAB_GIT_SHA=$1 HUMMING_CACHE_DIR=/tmp/humming-cache
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
case "$gpu" in *H200*|*H100*) ;; *) echo "not an H200: nothing to do"; exit 0;; esac
cp benchmarks/h200_moe_repeat.sh $OUT/call.sh
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/fp4libs/*.whl
start=$(date +%s); W=/tmp/repeats; mkdir -p $W
# first, from rest, how soon the sustained call brings the clock down (100 Hz telemetry), per format
for fmt in nvfp4 mxfp4; do
    PYTHONPATH=src:/tmp/site timeout -k 5 120 python3 benchmarks/moe_clock_probe.py --out $W/clock-$fmt \
        --fmt $fmt --seconds 4 --rest-s 3 --methods cuda-w4a16-moe 2>&1 | tail -8
    echo "clock probe $fmt: exit ${PIPESTATUS[0]} at $(( $(date +%s) - start )) s"
    tar -C $W -czf /tmp/repeats.tgz . && mv /tmp/repeats.tgz $OUT/repeats.tgz
done
# one run folder: its dense bf16 rows are measured once; each repeat's cuda-w4a16-moe row is
# appended to $W/repeats.jsonl, then dropped from the run so the next sweep measures it again
for i in $(seq 1 ${REPEATS:-3}); do
    for fmt in nvfp4 mxfp4; do
        [ $(( $(date +%s) - start )) -lt ${BUDGET_S:-420} ] || break 2
        PYTHONPATH=src:/tmp/site timeout -k 5 150 python3 -m fp4lab moe-sweep --preset glm-5 --batch 512 \
            --ep 1 --fmts $fmt --methods cuda-w4a16-moe --anatomy-batch --runs-dir $W --run-id run \
            --quiet >> $W/sweep.log 2>&1
        echo "repeat $i $fmt: exit $? at $(( $(date +%s) - start )) s"
        PYTHONPATH=src python3 -c "
import json, sys
from fp4lab import schema
from fp4lab.results import RunDir
run = RunDir.open(sys.argv[1])
rows = [r for r in run.read_rows('moe') if r['method'] == 'cuda-w4a16-moe']
with open(sys.argv[2], 'a') as out:
    for r in rows:
        out.write(json.dumps({'repeat': int(sys.argv[3]), **r}, default=str) + '\n')
        print(f\"  {r['fmt']} B={r['batch']} {r['status']}: median {r['median_us']} us, p20 {r['p20_us']}, \"
              f\"p80 {r['p80_us']}, {r['sm_clock_mhz']} MHz ({r.get('sm_clock_start_mhz')} -> {r.get('sm_clock_end_mhz')} MHz); window {r['avg_power_w']} W, {r['window_sm_clock_mhz']} MHz\")
run.drop_rows('moe', {schema.TABLES['moe'].row_key(r) for r in rows})
" $W/run $W/repeats.jsonl $i
        # written aside, then renamed: a call stopped at its limit keeps the last whole one
        tar -C $W -czf /tmp/repeats.tgz . && mv /tmp/repeats.tgz $OUT/repeats.tgz
    done
done
