#!/usr/bin/env bash
# Device call 2 on the H200: the whole test suite on the GPU, the timer cross-check again (after the
# clock warm-up fix), the triton-w4a16 tile tuning, and the GLM-5 MoE measurement at three batch
# sizes to size the full profile. Everything lands in $OUT.
source benchmarks/device_setup.sh
set -o pipefail
timeout 120 python3 -m pytest -q -p no:cacheprovider -o addopts="" -m "not browser" --timeout 100 tests \
    > $OUT/pytest_gpu.txt 2>&1; tail -5 $OUT/pytest_gpu.txt
timeout 80 python3 benchmarks/crosscheck_timer.py --out $OUT/crosscheck.json 2>&1 | tail -12
timeout 200 python3 benchmarks/tune_w4a16.py --out $OUT/tune_w4a16.json > $OUT/tune_w4a16.txt 2>&1
tail -45 $OUT/tune_w4a16.txt
mkdir -p $OUT/runs
( time timeout 90 python3 -m fp4lab moe-sweep --preset glm-5 --batch 64 512 2048 --device cuda \
    --runs-dir $OUT/runs --run-id moe-probe ) > $OUT/moe_probe.txt 2>&1; tail -25 $OUT/moe_probe.txt
tar -czf $OUT/moe_probe.tgz -C $OUT/runs . 2>/dev/null; rm -rf $OUT/runs
