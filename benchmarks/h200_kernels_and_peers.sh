#!/usr/bin/env bash
# One device call (H200): fp4lab's kernels tuned and timed (issue 13), the deployed 4-bit peers
# (issue 12: humming, tinygemm, gemlite, cuBLAS, humming's MoE), and NCCL at world size 1
# (issue 15), each under its own budget, everything packed into $OUT/call.tgz (the tool brings back
# at most 8 files) with the summaries printed last.
#   carry: .whl/fp4libs       run: bash benchmarks/h200_kernels_and_peers.sh
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.sm,clocks.max.sm --format=csv,noheader
W=/tmp/call && mkdir -p $W/kernels $W/peers $W/gemlite $W/comm
start=$(date +%s)
PYTHONPATH=src timeout -k 5 285 python3 benchmarks/h200_kernels.py --out $W/kernels --budget-s 270 \
    > $W/kernels.log 2>&1; echo "kernels: exit $? after $(( $(date +%s) - start )) s"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/fp4libs/*.whl
export HUMMING_CACHE_DIR=/tmp/humming-cache
PYTHONPATH=src:/tmp/site timeout -k 5 165 python3 benchmarks/h200_fp4_libraries.py --out $W/peers \
    --parts dense,moe --m 1,4,16,64,256 --batches 512,64 --models glm-5 --budget-s 155 --case-s 60 \
    > $W/peers.log 2>&1; echo "peers: exit $? after $(( $(date +%s) - start )) s"
PYTHONPATH=src:/tmp/site timeout -k 5 50 python3 benchmarks/h200_fp4_libraries.py --out $W/gemlite \
    --parts gemlite --shapes 8192x8192 --m 1,16 --budget-s 45 --case-s 40 \
    > $W/gemlite.log 2>&1; echo "gemlite: exit $? after $(( $(date +%s) - start )) s"
OUT=$W/comm bash benchmarks/h200_comm.sh 1 > $W/comm-summary.txt 2>&1
echo "comm: done after $(( $(date +%s) - start )) s"
tar -czf $OUT/call.tgz -C $W .
for f in kernels/summary.txt peers/summary.txt gemlite/summary.txt comm-summary.txt; do
    echo "=== $f"; tail -c 2500 $W/$f 2>/dev/null
done
