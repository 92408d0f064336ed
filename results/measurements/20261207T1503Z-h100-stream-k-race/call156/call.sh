#!/usr/bin/env bash
# device call 156 (session 43; calls 154-155 found stream-K's TMA race): stream-K's NaNs at 8192x8192 M=64 sk3 (call 152), located:
# tmp_skdebug.py's variants, then the stream-K GPU tests.
set -u
start=$(date +%s); W=/tmp/w156; mkdir -p $W
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader | tee $W/gpu.txt
export PYTHONUNBUFFERED=1
PYTHONPATH=src timeout -k 5 200 python3 tmp_skdebug.py $W/skdebug.json > $W/skdebug.log 2>&1
echo "debug: exit $? at $(( $(date +%s) - start )) s"; grep -v Warning $W/skdebug.log | cut -c1-330 | tail -50
PYTHONPATH=src timeout -k 5 150 python3 -m pytest -q -m cuda -p no:cacheprovider -p no:benchmark \
    tests/test_backends_triton.py -k stream_k > $W/tests.log 2>&1
echo "tests: exit $? at $(( $(date +%s) - start )) s"; tail -15 $W/tests.log | cut -c1-300
T=$W/probe; mkdir -p $T
PYTHONPATH=src timeout -k 5 100 python3 benchmarks/tune_w4a16.py --out $T --m 64 --formats nvfp4 --budget-s 80 \
    --shapes 8192x8192 --configs benchmarks/configs/m64_wave_probe.json > $T/tune.log 2>&1
echo "probe: exit $? at $(( $(date +%s) - start )) s"; grep -v Warning $T/tune.log | grep "sk\|s4 w4" | cut -c1-140
cp tmp_skdebug.py tmp_call.sh $W/
tar -C $W -czf $OUT/call156.tar.gz .
