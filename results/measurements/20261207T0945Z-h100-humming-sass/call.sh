#!/usr/bin/env bash
# device call 143 (session 41). On an H200: the reference run's cuda-w4a16-moe rows with the
# adopted k loop (h200_cuda_moe.sh sweep, both formats, no GPU tests: the sweep gates every
# point). On any other GPU: benchmarks/humming_sass.py, the tensor-core instructions of the
# kernels humming compiles at the M = 16, 64 and 256 points (NVFP4).
# Everything lands in one tarball: a call brings back at most 8 files.
set -u
start=$(date +%s); W=/tmp/w143; mkdir -p $W
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $gpu"
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader > $W/gpu.txt
export PYTHONUNBUFFERED=1 FP4LAB_GIT_SHA=5af2035a5927ba5339d41b7f90c66af7b18f18c6
if echo "$gpu" | grep -q H200; then
    mkdir -p $W/moe
    OUT=$W/moe GPU_TESTS=0 HUMMING_CACHE_DIR=/tmp/humming-cache timeout -k 5 540 bash benchmarks/h200_cuda_moe.sh 5af2035a5927ba5339d41b7f90c66af7b18f18c6 sweep > $W/moe/call.log 2>&1
    echo "moe sweep: exit $? at $(( $(date +%s) - start )) s"; tail -30 $W/moe/call.log
else
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/fp4libs/*.whl
    mkdir -p $W/humming-sass
    which cuobjdump nvcc > $W/humming-sass/tools.txt 2>&1; nvcc --version | tail -2 >> $W/humming-sass/tools.txt
    PATH=$PATH:/usr/local/cuda/bin PYTHONPATH=src:/tmp/site timeout -k 5 400 python3 benchmarks/humming_sass.py         --points nvfp4:8192x8192:16,nvfp4:8192x8192:64,nvfp4:8192x8192:256,nvfp4:4096x6144:64,nvfp4:6144x2048:64         --out $W/humming-sass > $W/humming-sass/probe.log 2>&1
    echo "humming sass: exit $? at $(( $(date +%s) - start )) s"; cat $W/humming-sass/tools.txt; grep -v Warning $W/humming-sass/probe.log | tail -60
fi
tar -C $W -czf $OUT/call143.tar.gz .
echo "done at $(( $(date +%s) - start )) s"
