#!/usr/bin/env bash
# Device call 6 on the H200: launch overhead. The same decode-size points timed as CUDA-graph
# replays and as eager launches (sweep --eager), one run folder each, in one session.
source benchmarks/device_setup.sh
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
for mode in graph eager; do
    flag=$([ $mode = eager ] && echo --eager)
    timeout 200 python3 -m fp4lab sweep --backends torch-bf16,triton-w4a16 --format nvfp4 \
        --m 1,16,64 --shapes 6144x2048,4096x6144,8192x8192 --device cuda --energy-window 0 \
        --repeats 50 $flag --quiet --out "$OUT/runs" --run-id "$STAMP-h200-launch-$mode" 2>&1 | tail -2
done
python3 - "$OUT/runs" <<'PY'
import sys, pandas as pd
from pathlib import Path
frames = [pd.read_parquet(p) for p in sorted(Path(sys.argv[1]).glob("*/gemm.parquet"))]
both = pd.concat(frames).pivot_table(index=["backend", "n", "k", "m"], columns="graph", values="median_us")
both["launch_us"] = both[False] - both[True]
print(both.round(2).to_string())
PY
tar -czf "$OUT/launch.tgz" -C "$OUT/runs" . && rm -rf "$OUT/runs"
