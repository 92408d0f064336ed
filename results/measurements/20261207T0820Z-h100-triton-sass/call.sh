#!/usr/bin/env bash
# device call 136 (session 40): the device's Triton reads for wgmma serialization in the dense
# presets at issue 13's points (benchmarks/triton_sass.py --out, the folder chapter 01 reads);
# on an H200 then the reference run's
# cuda-w4a16-moe rows re-measured with the adopted k loop (h200_cuda_moe.sh sweep, gated point by
# point) and the dense presets beside their reduction twins and the peers at issue 13's three
# shapes, M = 16 and 64. Everything lands in one tarball: a call brings back at most 8 files.
set -u
SHA=$1; start=$(date +%s); W=/tmp/w136; mkdir -p $W/sass
left() { echo $(( ${BUDGET:-560} - ($(date +%s) - start) )); }
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $gpu"
kind=$(echo "$gpu" | grep -q H200 && echo h200 || echo h100); SASS_ID=$(date -u +%Y%m%dT%H%MZ)-$kind-triton-sass
points=$(for f in nvfp4 mxfp4; do for m in 16 64 256; do for s in 8192x8192 4096x6144 6144x2048; do printf "$f:$s:$m,"; done; done; done)
FP4LAB_GIT_SHA=$SHA PYTHONPATH=src timeout -k 5 200 python3 benchmarks/triton_sass.py --points $points \
    --out $W/sass/$SASS_ID > $W/sass/sass.log 2>&1
echo "sass: exit $? at $(( $(date +%s) - start )) s"; grep -v Warn $W/sass/sass.log
if echo "$gpu" | grep -q H200; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/fp4libs/*.whl
    OUT=$W/sweep GPU_TESTS=0 timeout -k 5 340 bash benchmarks/h200_cuda_moe.sh $SHA sweep
    echo "sweep part: exit $? at $(( $(date +%s) - start )) s"
    mkdir -p $W/dense
    PYTHONPATH=src:/tmp/site HUMMING_CACHE_DIR=/tmp/humming-cache timeout -k 5 $(( $(left) - 5 )) \
        python3 benchmarks/cuda_probe.py --out $W/dense --preset-only --no-anatomy --formats nvfp4,mxfp4 \
        --m 16,64 --shapes 8192x8192,4096x6144,6144x2048 > $W/dense/probe.log 2>&1
    echo "dense probe: exit $? at $(( $(date +%s) - start )) s"; grep -v Warning $W/dense/probe.log | tail -45
fi
tar -C $W -czf $OUT/call136.tar.gz .
echo "done at $(( $(date +%s) - start )) s"
