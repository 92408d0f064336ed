#!/usr/bin/env bash
# device call 139 (session 40): the dense GPU tests with the M = 17-32 preset (8 warps, register
# cap for three CTAs an SM, vector reduction; call 138), then each point's preset and its
# reduction twin at M = 24 and 32 on the shapes of call 138 (the preset's pick checked per point).
# Everything lands in one tarball: a call brings back at most 8 files.
set -u
start=$(date +%s); W=/tmp/w139; mkdir -p $W/dense
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $gpu"
PYTHONPATH=src timeout -k 5 300 python3 -m pytest -q -m cuda -p no:cacheprovider -p no:benchmark \
    tests/test_cuda_w4a16.py > $W/dense/tests.log 2>&1
echo "dense GPU tests: exit $? at $(( $(date +%s) - start )) s"; tail -4 $W/dense/tests.log
PYTHONPATH=src timeout -k 5 150 python3 benchmarks/cuda_probe.py --out $W/dense --preset-only --no-peers \
    --no-anatomy --formats nvfp4,mxfp4 --m 24,32 --shapes 4096x6144,8192x8192,2048x8192,4096x4096 \
    > $W/dense/probe.log 2>&1
echo "dense probe: exit $? at $(( $(date +%s) - start )) s"; grep -v Warning $W/dense/probe.log | tail -40
tar -C $W -czf $OUT/call139.tar.gz .
echo "done at $(( $(date +%s) - start )) s"
