#!/usr/bin/env bash
# device call 134 (session 40): on an H200 the reference run's cuda-w4a16-moe rows re-measured with
# the adopted k loop (h200_cuda_moe.sh sweep, gated point by point), then the dense presets (the
# vector split-K reduction adopted in session 39) beside their reduction twins and the peers at
# issue 13's three shapes, M = 16 and 64. On another GPU the dense part alone.
# Everything lands in one tarball: a call brings back at most 8 files.
set -u
SHA=$1; start=$(date +%s); W=/tmp/w134; mkdir -p $W
left() { echo $(( ${BUDGET:-560} - ($(date +%s) - start) )); }
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $gpu"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/fp4libs/*.whl
if echo "$gpu" | grep -q H200; then
    OUT=$W/sweep GPU_TESTS=0 timeout -k 5 340 bash benchmarks/h200_cuda_moe.sh $SHA sweep
    echo "sweep part: exit $? at $(( $(date +%s) - start )) s"
fi
mkdir -p $W/dense
PYTHONPATH=src:/tmp/site HUMMING_CACHE_DIR=/tmp/humming-cache timeout -k 5 $(( $(left) - 5 )) \
    python3 benchmarks/cuda_probe.py --out $W/dense --preset-only --no-anatomy --formats nvfp4,mxfp4 \
    --m 16,64 --shapes 8192x8192,4096x6144,6144x2048 > $W/dense/probe.log 2>&1
echo "dense probe: exit $? at $(( $(date +%s) - start )) s"; grep -v Warning $W/dense/probe.log | tail -45
tar -C $W -czf $OUT/call134.tar.gz .
echo "done at $(( $(date +%s) - start )) s"
