#!/usr/bin/env bash
# Record of the call made at commit 6fa99ef; --compare-decode (and the bf16 decode it compared)
# was removed afterwards, so this script no longer re-runs as is.
# Device call 3 on the H200: fp16 vs bf16 weight decode in triton-w4a16, the whole test suite on
# the GPU (named failures), and the MoE measurement for a second preset (DeepSeek-V3) as its own run.
source benchmarks/device_setup.sh
set -o pipefail
timeout 100 python3 benchmarks/tune_w4a16.py --compare-decode --out $OUT/compare_decode.json \
    > $OUT/compare_decode.txt 2>&1; tail -30 $OUT/compare_decode.txt
timeout 200 python3 -m pytest -q -n 4 -p no:cacheprovider -o addopts="" -m "not browser" \
    --timeout 100 -rfE --tb=short tests > $OUT/pytest_gpu.txt 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/pytest_gpu.txt | tail -25
RUN_ID=$(date -u +%Y%m%dT%H%M%SZ)-h200-moe-deepseek-v3
timeout 120 python3 -m fp4lab moe-sweep --preset deepseek-v3 --batch 64 256 1024 --device cuda \
    --runs-dir $OUT/runs --run-id $RUN_ID 2>&1 | grep -v "moe deepseek" | tail -8
tar -czf $OUT/$RUN_ID.tgz -C $OUT/runs $RUN_ID && rm -rf $OUT/runs
