#!/usr/bin/env bash
# Device call: communication (issue 15), `python -m fp4lab comm` over NCCL, one run folder.
#   bash benchmarks/h200_comm.sh        # every GPU the machine has (the one-GPU H200: world size 1)
#   bash benchmarks/h200_comm.sh 8      # an 8-GPU box: group sizes 2, 4, 8
# Needs only torch, pandas, pyarrow and nvidia-ml-py from the machine (no carried wheels).
# One GPU: every op is degenerate (a one-rank all-reduce, all-to-all and send to itself) but
# exercised through NCCL, data check, graph capture and the timer; uniform routing only, since at
# one rank every routing sends every row to itself. Budget: 60 s there (whole-run limit 50 s).
# NVLink multicast stays off: the launcher sets NCCL_NVLS_ENABLE=0,
# TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1 for every rank.
# Writes $OUT/comm-run.tgz (the run folder), $OUT/comm.log (its output, tail), summary last.
# DEVICE=cpu PYTHON=.venv/bin/python runs the same script on a CPU (gloo), to check the script.
set -u
NPROC=${1:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || echo 1)}
[ "$NPROC" -ge 1 ] 2>/dev/null || NPROC=1
DEVICE=${DEVICE:-cuda}
PYTHON=${PYTHON:-python3}
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1
RUN_ID="$(date -u +%Y%m%dT%H%M%SZ)-comm-$NPROC"
if [ "$NPROC" = 1 ]; then ROUTING=uniform; LIMIT=50; else ROUTING=uniform,zipf:0.7; LIMIT=500; fi
PROFILE=$([ "$DEVICE" = cpu ] && echo smoke || echo full)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>/dev/null

timeout -k 5 $((LIMIT + 8)) "$PYTHON" -m fp4lab comm --nproc-per-node "$NPROC" --device "$DEVICE" \
    --profile "$PROFILE" --routing "$ROUTING" --point-timeout 20 --timeout "$LIMIT" --quiet \
    --out "$OUT/runs" --run-id "$RUN_ID" > "$OUT/comm.full.log" 2>&1
STATUS=$?
tail -c 2000000 "$OUT/comm.full.log" > "$OUT/comm.log" && rm -f "$OUT/comm.full.log"
grep "^fp4lab comm:" "$OUT/comm.log" | tail -3

timeout 30 "$PYTHON" - "$OUT/runs/$RUN_ID" "$STATUS" <<'PY'
import json, sys
from pathlib import Path
import pandas as pd
run, status = Path(sys.argv[1]), sys.argv[2]
info = json.loads((run / "run.json").read_text()).get("comm", {}) if (run / "run.json").exists() else {}
table = pd.read_parquet(run / "comm.parquet") if (run / "comm.parquet").exists() else pd.DataFrame()
print(f"exit {status}; run {info.get('status', 'missing')}; {len(table)} rows; "
      f"backend {info.get('backend')}; groups {info.get('group_sizes')}")
if info.get("failure"):
    print("failure:", info["failure"][:400])
topo = (info.get("topology") or {})
print("topology:", "recorded" if topo.get("matrix") else topo.get("note"))
if len(table):
    ok = table[table["status"] == "ok"]
    bad = table[table["status"] != "ok"]
    for _, row in bad.drop_duplicates(["op", "status"]).iterrows():
        print(f"{row['op']} n={row['world_size']}: {row['status']}: {str(row['error'])[:150]}")
    if len(ok):
        ok = ok.assign(key=ok["op"].str.replace("all_to_all_", "a2a_") + " n" +
                       ok["world_size"].astype(str) + " " + ok["dtype"] + " " +
                       ok["routing"].fillna("").str[:8] + " " + ok["graph"].map({True: "G", False: "E"}))
        wide = ok.pivot_table(index="key", columns="tokens", values="median_us", aggfunc="median")
        keep = [t for t in (1, 16, 128, 1024, 2048) if t in wide.columns]
        print("median us by tokens (G = CUDA graph, E = eager)")
        print(wide[keep].round(2).to_string())
        best = ok.groupby(["op", "world_size"])["busbw_gbps"].max().round(2)
        print("best busbw GB/s:", ", ".join(f"{op} n{n} {v}" for (op, n), v in best.items()))
PY
[ -d "$OUT/runs" ] && tar -czf "$OUT/comm-run.tgz" -C "$OUT/runs" . && rm -rf "$OUT/runs"
