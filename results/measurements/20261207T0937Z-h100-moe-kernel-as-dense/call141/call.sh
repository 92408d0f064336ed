#!/usr/bin/env bash
# device call 141 (session 41). On an H200: the reference run's cuda-w4a16-moe rows with the
# adopted k loop (h200_cuda_moe.sh sweep, both formats, no GPU tests: the sweep gates every
# point). On any other GPU: benchmarks/moe_kernel_dense_probe.py (the fused MoE kernel's sync and wgmma builds as a dense GEMM at M = 64-256 with emulated split-K, beside the peers, NVFP4).
# Everything lands in one tarball: a call brings back at most 8 files.
set -u
start=$(date +%s); W=/tmp/w141; mkdir -p $W
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $gpu"
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader > $W/gpu.txt
export HUMMING_CACHE_DIR=/tmp/humming-cache PYTHONUNBUFFERED=1
if echo "$gpu" | grep -q H200; then
    mkdir -p $W/moe
    OUT=$W/moe GPU_TESTS=0 timeout -k 5 540 bash benchmarks/h200_cuda_moe.sh 4c2e1871f8063936fb5c1fcfabdab035f7a4407b sweep > $W/moe/call.log 2>&1
    echo "moe sweep: exit $? at $(( $(date +%s) - start )) s"; tail -30 $W/moe/call.log
else
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/fp4libs/*.whl
    mkdir -p $W/moe-dense
    FP4LAB_GIT_SHA=4c2e1871f8063936fb5c1fcfabdab035f7a4407b PYTHONPATH=src:/tmp/site timeout -k 5 520 python3 benchmarks/moe_kernel_dense_probe.py \
        --out $W/moe-dense > $W/moe-dense/probe.log 2>&1
    echo "probe: exit $? at $(( $(date +%s) - start )) s"; grep -v Warning $W/moe-dense/probe.log | tail -150
fi
tar -C $W -czf $OUT/call141.tar.gz .
echo "done at $(( $(date +%s) - start )) s"
