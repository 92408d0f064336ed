#!/usr/bin/env bash
# One device call (H200 only; planned in session 44, not yet run): in a copy of the reference run,
#  1. cuda-w4a16-moe rows re-measured with the adopted k loop, NVFP4 (plan item 1 since session 38),
#     B = 256 now with them (the other methods' rows have it);
#  2. cuda-w4a16 rows whose preset changed since they were measured (the vector reduction:
#     4096x6144 M = 16, 8192x8192 and 4096x6144 M = 64; both formats) dropped and re-swept;
#  3. cuda-w4a16-moe MXFP4 if time is left.
# At most 8 files come back: the run folder as $OUT/run.tgz and the logs as $OUT/logs.tgz, both
# rewritten after each step.
#   carry: .whl/fp4libs       run: bash benchmarks/h200_reference_resweep.sh <full commit>
set -u
start=$(date +%s); SHA=$1; RUN=/tmp/runs/20261203T1155Z-h200-full; W=/tmp/w44
mkdir -p $W/moe-nvfp4 $W/moe-mxfp4
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
case "$gpu" in *H200*) ;; *) echo "not an H200: nothing to do"; exit 0;; esac
cp benchmarks/h200_reference_resweep.sh $OUT/call.sh
bring_back() {
    # written aside, then renamed: a call stopped at its limit mid-write keeps the last whole one
    tar -C /tmp/runs -czf $W.run.tgz $(basename $RUN) && mv $W.run.tgz $OUT/run.tgz
    tar -C $W -czf $W.logs.tgz . && mv $W.logs.tgz $OUT/logs.tgz
    echo "step $1 done at $(( $(date +%s) - start )) s"
}
OUT=$W/moe-nvfp4 FMTS=nvfp4 GPU_TESTS=0 bash benchmarks/h200_cuda_moe.sh $SHA sweep; bring_back 1
export FP4LAB_GIT_SHA=$SHA PYTHONUNBUFFERED=1
PYTHONPATH=src python3 -c "
import sys
from fp4lab import schema
from fp4lab.results import RunDir
run = RunDir.open(sys.argv[1])
changed = {(16, 4096, 6144), (64, 8192, 8192), (64, 4096, 6144)}
keys = {schema.TABLES['gemm'].row_key(r) for r in run.read_rows('gemm')
        if r['backend'] == 'cuda-w4a16' and (r['m'], r['n'], r['k']) in changed}
print('dropped', run.drop_rows('gemm', keys), 'cuda-w4a16 gemm rows to re-measure')
" $RUN
PYTHONPATH=src:/tmp/site timeout -k 5 150 python3 -m fp4lab sweep --resume $RUN --quiet > $W/dense.log 2>&1
echo "dense re-sweep: exit $?"; tail -12 $W/dense.log; bring_back 2
if [ $(( $(date +%s) - start )) -lt 300 ]; then
    OUT=$W/moe-mxfp4 FMTS=mxfp4 GPU_TESTS=0 bash benchmarks/h200_cuda_moe.sh $SHA sweep; bring_back 3
fi
