#!/usr/bin/env bash
# device call 133 (session 39). On an H200: the reference run's cuda-w4a16-moe rows re-measured
# with the adopted k loop (GPU tests: call 128), Nsight over the dense presets, then the g8
# preset's points beside their reduction twins at M = 12 and 16. On another GPU: the wide
# presets' twins at M = 32 and 64 (the vector reduction is unmeasured over M = 16).
# Everything lands in one tarball: a call brings back at most 8 files.
set -u
SHA=$1; start=$(date +%s); W=/tmp/w133; mkdir -p $W/dense
left() { echo $(( ${BUDGET:-470} - ($(date +%s) - start) )); }
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $gpu"
if echo "$gpu" | grep -q H200; then
    OUT=$W/sweep GPU_TESTS=0 timeout -k 5 320 bash benchmarks/h200_cuda_moe.sh $SHA sweep
    echo "sweep part: exit $? at $(( $(date +%s) - start )) s"
    OUT=$W/ncu FP4LAB_GIT_SHA=$SHA NCU_ID=$NCU_ID NCU_WHAT="device call 133: Nsight Compute over cuda-w4a16's presets at $SHA" \
        timeout -k 5 80 bash benchmarks/h200_ncu_cuda.sh
    echo "ncu: exit $? at $(( $(date +%s) - start )) s"
    m=12,16; shapes=4096x6144,2048x8192,4096x4096,8192x4096,8192x8192
else
    m=32,64; shapes=4096x6144,2048x8192,4096x4096,8192x8192
fi
PYTHONPATH=src timeout -k 5 $(( $(left) - 5 )) python3 benchmarks/cuda_probe.py --out $W/dense \
    --preset-only --no-peers --no-anatomy --formats nvfp4,mxfp4 --m $m --shapes $shapes > $W/dense/probe.log 2>&1
echo "dense probe: exit $? at $(( $(date +%s) - start )) s"; grep -v Warning $W/dense/probe.log | tail -45
tar -C $W -czf $OUT/call133.tar.gz .
echo "done at $(( $(date +%s) - start )) s"
