#!/usr/bin/env bash
# device call 132 (session 39): the dense kernel's split-K reduction switch (CudaTileConfig.reduce)
# gated by the GPU tests, then each decode point's preset beside its vector-reduction twin at
# M = 12 and 16 over shapes of both presets that split K (g16: 8192x8192, 14336x4096, 4096x14336;
# g8: 4096x6144, 8192x4096, 2048x8192, 4096x4096); on an H200 first the reference run's
# cuda-w4a16-moe rows re-measured with the adopted k loop and Nsight over the dense presets.
# Everything lands in one tarball: a call brings back at most 8 files.
set -u
SHA=$1; start=$(date +%s); W=/tmp/w132; mkdir -p $W
left() { echo $(( ${BUDGET:-540} - ($(date +%s) - start) )); }
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $gpu"
if echo "$gpu" | grep -q H200; then
    OUT=$W/sweep GPU_TESTS=0 timeout -k 5 330 bash benchmarks/h200_cuda_moe.sh $SHA sweep
    echo "sweep part: exit $? at $(( $(date +%s) - start )) s"
    OUT=$W/ncu FP4LAB_GIT_SHA=$SHA NCU_ID=$NCU_ID NCU_WHAT="device call 132: Nsight Compute over cuda-w4a16's presets at $SHA" \
        timeout -k 5 100 bash benchmarks/h200_ncu_cuda.sh
    echo "ncu: exit $? at $(( $(date +%s) - start )) s"
fi
mkdir -p $W/dense
t=$(( $(left) - 100 )); [ $t -gt 200 ] && t=200
PYTHONPATH=src timeout -k 5 $t python3 -m pytest -q -m cuda -p no:cacheprovider -p no:benchmark \
    tests/test_cuda_w4a16.py > $W/dense/tests.log 2>&1
echo "dense GPU tests: exit $? at $(( $(date +%s) - start )) s"; tail -6 $W/dense/tests.log
PYTHONPATH=src timeout -k 5 $(( $(left) - 5 )) python3 benchmarks/cuda_probe.py --out $W/dense \
    --preset-only --no-peers --no-anatomy --formats nvfp4,mxfp4 --m 12,16 \
    --shapes 8192x8192,14336x4096,4096x14336,4096x6144,8192x4096,2048x8192,4096x4096 > $W/dense/probe.log 2>&1
echo "dense probe: exit $? at $(( $(date +%s) - start )) s"; grep -v Warning $W/dense/probe.log | tail -60
tar -C $W -czf $OUT/call132.tar.gz .
echo "done at $(( $(date +%s) - start )) s"
