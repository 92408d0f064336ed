#!/usr/bin/env bash
# device call 138 (session 40): the wide preset's build at M = 32 with a register cap for three
# CTAs an SM (min_ctas 3) beside the preset's (min_ctas 2), each launched both ways and with both
# split-K reductions (the probe's twins): does the vector reduction pay at M = 17-32 once it keeps
# three CTAs an SM (call 133: 82 registers against 78, two CTAs against three, NVFP4)?
# Everything lands in one tarball: a call brings back at most 8 files.
set -u
start=$(date +%s); W=/tmp/w138; mkdir -p $W/dense
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $gpu"
PYTHONPATH=src timeout -k 5 400 python3 benchmarks/cuda_probe.py --out $W/dense --no-peers --no-anatomy \
    --formats nvfp4,mxfp4 --m 32 --shapes 4096x6144,8192x8192,2048x8192,4096x4096 \
    --builds "8,4,8,1,2;8,4,8,1,3" > $W/dense/probe.log 2>&1
echo "dense probe: exit $? at $(( $(date +%s) - start )) s"; grep -v Warning $W/dense/probe.log | tail -80
tar -C $W -czf $OUT/call138.tar.gz .
echo "done at $(( $(date +%s) - start )) s"
