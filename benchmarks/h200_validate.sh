#!/usr/bin/env bash
# Device call 1 on the H200: check every CUDA path (tests marked cuda), cross-check the timer
# against triton's do_bench_cudagraph, measure the telemetry sampler's overhead, and time a small
# sweep to size the full profile. Everything lands in $OUT.
source benchmarks/device_setup.sh
set -o pipefail
python3 -m fp4lab backends | tee $OUT/backends.txt
timeout 200 python3 -m pytest -q -m cuda -p no:cacheprovider -o addopts="" --timeout 120 tests 2>&1 | tail -40 | tee $OUT/pytest_cuda.txt
timeout 90 python3 benchmarks/crosscheck_timer.py --out $OUT/crosscheck.json 2>&1 | tail -20
timeout 90 python3 benchmarks/telemetry_overhead.py --out $OUT/overhead.json 2>&1 | tail -20
timeout 120 python3 -m fp4lab sweep --backends torch-bf16,torch-fp8,emulated,triton-w4a16 \
    --format nvfp4 --m 1,16,256,4096 --shapes 6144x2048,4096x6144 --device cuda \
    --out $OUT/runs --run-id validate 2>&1 | tail -25
tar -czf $OUT/validate_run.tgz -C $OUT/runs . 2>/dev/null; rm -rf $OUT/runs
