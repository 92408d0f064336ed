#!/usr/bin/env bash
# One device call (H200) for fp4lab's CUDA fused MoE (`cuda-w4a16-moe`, issue 13): the async build's
# operand layouts on one warpgroup (benchmarks/wgmma_probe.py, seconds), its GPU tests,
# then (part "probe") its builds and anatomy against humming-moe-indexed and triton-w4a16-moe
# (benchmarks/cuda_moe_probe.py), and/or (part "sweep", only if the tests passed) its rows in a copy
# of the reference run re-measured with the preset (its earlier cuda-w4a16-moe rows dropped, then
# `fp4lab moe-sweep` resumed: GLM-5 at B = 64-4096 on one GPU and the busiest EP 8 rank,
# DeepSeek-V3 at B = 64 and 512, both formats; on an H200 only; the full profile also dissects the
# kernel at B = 512, its loads-only / decode / whole builds into the moe_anatomy table), the run's
# moe and moe_anatomy tables, run.json and the logs brought back under $OUT.
#   carry: .whl/fp4libs       run: bash benchmarks/h200_cuda_moe.sh <commit> [probe|sweep|all]
#   (<commit> spelled out: the device's copy of the tree may answer `git rev-parse` with an older one)
#   PROBE_POINTS=glm-5:512 (the probe's --points) narrows the probe to those points
#   PROBE_BUDGET_S=380 gives the probe that many seconds (240 when not set)
#   PROBE_GRID=buffers (the probe's --grid) times that grid at the first point, every build dissected
#   PROBE_BASELINE="old.cu ..." (the probe's --baseline-kernel, each file) times the first point's
#   preset built from those kernel files too, before the current one, then each in turn with the
#   current one for the ratio of their times (write them with git show
#   <sha>:src/fp4lab/backends/cuda_moe_kernel.cu into the tree before the call: the device's copy
#   has no history)
#   FMTS=nvfp4 narrows the sweep part to that format's rows (the others kept as they are); run again
#   with FMTS=mxfp4 on the same machine, it re-measures those in the same copy of the run
#   GPU_TESTS=0 leaves out the GPU tests (for a commit whose builds an earlier call gated; the sweep
#   still gates every point before it times it)
set -u
export PYTHONUNBUFFERED=1 FP4LAB_GIT_SHA=$1 HUMMING_CACHE_DIR=/tmp/humming-cache
PART=${2:-all}
REFERENCE=results/reference/20261203T1155Z-h200-full
case $PART in probe|sweep|all) ;; *) echo "part must be probe, sweep or all, got $PART"; exit 2;; esac
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/fp4libs/*.whl
s=$(date +%s)
PYTHONPATH=src timeout -k 5 60 python3 benchmarks/wgmma_probe.py > $OUT/wgmma_probe.log 2>&1
echo "wgmma probe: exit $?"; tail -12 $OUT/wgmma_probe.log
tests=0
if [ "${GPU_TESTS:-1}" != 0 ]; then
    PYTHONPATH=src timeout -k 5 150 python3 -m pytest -q -m cuda -p no:cacheprovider -p no:benchmark \
        tests/test_cuda_moe.py > $OUT/tests.log 2>&1
    tests=$?; tail -15 $OUT/tests.log; echo "tests: exit $tests after $(( $(date +%s) - s )) s"
fi
if [ $PART != sweep ]; then
    mkdir -p $OUT/probe
    PYTHONPATH=src:/tmp/site timeout -k 5 $(( ${PROBE_BUDGET_S:-240} + 20 )) python3 \
        benchmarks/cuda_moe_probe.py --out $OUT/probe --budget-s ${PROBE_BUDGET_S:-240} \
        ${PROBE_POINTS:+--points $PROBE_POINTS} ${PROBE_GRID:+--grid $PROBE_GRID} \
        $(for f in ${PROBE_BASELINE:-}; do echo --baseline-kernel $f; done) > $OUT/probe/probe.log 2>&1
    echo "probe: exit $? after $(( $(date +%s) - s )) s"; grep -v Warning $OUT/probe/probe.log | tail -70
fi
[ $PART != probe ] || exit 0
[ $tests -eq 0 ] || exit 1
# the reference run is the H200's: on another GPU the probe stands alone
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "not an H200: no reference rows"; exit 0; }
RUN=/tmp/runs/$(basename $REFERENCE)
# a second call on the same machine (FMTS=mxfp4 after FMTS=nvfp4) adds to the copy the first made
[ -d $RUN ] || { mkdir -p /tmp/runs && cp -r $REFERENCE /tmp/runs/; }
FMTS=${FMTS:-nvfp4 mxfp4}
PYTHONPATH=src python3 -c "
import sys
from fp4lab import schema
from fp4lab.results import RunDir
run, fmts = RunDir.open(sys.argv[1]), sys.argv[2].split()
for table in ('moe', 'moe_anatomy'):
    keys = {schema.TABLES[table].row_key(r) for r in run.read_rows(table)
            if r['method'] == 'cuda-w4a16-moe' and r['fmt'] in fmts}
    print('dropped', run.drop_rows(table, keys), 'cuda-w4a16-moe', table, 'rows to re-measure')
" $RUN "$FMTS"
for args in "glm-5 --batch 64 256 512 2048 4096 --ep 1 8" "deepseek-v3 --batch 64 512 --ep 1"; do
    PYTHONPATH=src:/tmp/site timeout -k 5 200 python3 -m fp4lab moe-sweep --preset $args \
        --fmts $FMTS --methods cuda-w4a16-moe --runs-dir /tmp/runs --run-id $(basename $REFERENCE) --quiet \
        >> $OUT/sweep.log 2>&1
    echo "moe-sweep $args: exit $? after $(( $(date +%s) - s )) s"
done
tail -30 $OUT/sweep.log
cp $RUN/{moe.parquet,moe.jsonl,moe_anatomy.parquet,moe_anatomy.jsonl,run.json} $OUT/
