#!/usr/bin/env bash
# device call 135 (session 40): the device's Triton reads for wgmma serialization in the dense
# tensor-core presets (benchmarks/triton_sass.py); on an H200 then the reference run's
# cuda-w4a16-moe rows re-measured with the adopted k loop (h200_cuda_moe.sh sweep, gated point by
# point) and the dense presets beside their reduction twins and the peers at issue 13's three
# shapes, M = 16 and 64. Everything lands in one tarball: a call brings back at most 8 files.
set -u
SHA=$1; start=$(date +%s); W=/tmp/w135; mkdir -p $W/sass
left() { echo $(( ${BUDGET:-560} - ($(date +%s) - start) )); }
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $gpu"
PYTHONPATH=src timeout -k 5 120 python3 benchmarks/triton_sass.py --points \
    nvfp4:8192x8192:16,nvfp4:8192x8192:64,nvfp4:4096x6144:64,nvfp4:6144x2048:64,nvfp4:8192x8192:256,nvfp4:4096x6144:256,mxfp4:8192x8192:64,mxfp4:8192x8192:256 \
    > $W/sass/sass.log 2>&1
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
tar -C $W -czf $OUT/call135.tar.gz .
echo "done at $(( $(date +%s) - start )) s"
