#!/usr/bin/env bash
# Nsight Compute over cuda-w4a16's presets (benchmarks/ncu_profile.py --cuda), written straight into
# the tree's results/measurements/$NCU_ID as a complete profile folder (raw.csv, launches.json,
# run.json), so that a `make report` later in the same device call executes chapter 01 against the
# profile of the builds it measures; the folder comes back as $OUT/$NCU_ID.tar.gz to be committed.
#   FP4LAB_GIT_SHA=<sha> NCU_ID=<utc>-h200-ncu-cuda NCU_WHAT="device call N ..." bash benchmarks/h200_ncu_cuda.sh
set -u
: "${FP4LAB_GIT_SHA:?the commit (the tree travels without .git)}" "${NCU_ID:?the folder name}"
folder="results/measurements/$NCU_ID"
mkdir -p "$folder" "$OUT"
export PYTHONPATH="$PWD/src"
metrics="$(python3 benchmarks/ncu_profile.py --metrics)" || exit 1
start=$(date +%s)
ncu --clock-control none --profile-from-start off --csv --page raw --metrics "$metrics" \
    --log-file "$folder/raw.csv" python3 benchmarks/ncu_profile.py --cuda > "$OUT/ncu-run.log" 2>&1
status=$?
wall=$(( $(date +%s) - start ))
echo "ncu: exit $status in $wall s" | tee -a "$OUT/ncu-run.log"
python3 benchmarks/ncu_profile.py --cuda --describe --launches "$folder/launches.json" || status=1
NCU_WALL="$wall" python3 - "$folder" <<'EOF'
import json, os, subprocess, sys
import torch, triton
folder = sys.argv[1]
smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,power.limit", "--format=csv,noheader,nounits"],
                     capture_output=True, text=True).stdout.split(",")
props = torch.cuda.get_device_properties(0)
run_id = os.path.basename(folder)
info = {"run_id": run_id, "created": f"{run_id[:4]}-{run_id[4:6]}-{run_id[6:8]}T{run_id[9:11]}:{run_id[11:13]}:00+00:00",
        "profiled": "fp4lab-cuda",
        "what": os.environ.get("NCU_WHAT", "Nsight Compute over benchmarks/ncu_profile.py --cuda"),
        "provenance": {"device": {"kind": "cuda", "name": props.name, "spec": "h200" if "H200" in props.name else "",
                                  "driver": smi[0].strip() if smi[0] else None,
                                  "power_limit_w": float(smi[1]) if len(smi) > 1 else None,
                                  "compute_capability": [props.major, props.minor]},
                       "versions": {"torch": torch.__version__, "triton": triton.__version__},
                       "fp4lab_git_sha": os.environ["FP4LAB_GIT_SHA"],
                       "command": "FP4LAB_GIT_SHA=... NCU_ID=... bash benchmarks/h200_ncu_cuda.sh"},
        "wall_s": float(os.environ["NCU_WALL"])}
open(os.path.join(folder, "run.json"), "w").write(json.dumps(info, indent=2) + "\n")
EOF
# one file: a call brings back at most 8 from $OUT, and a sweep in the same call writes six (call 127
# lost the folder when it travelled as three)
tar -C "$(dirname "$folder")" -czf "$OUT/$NCU_ID.tar.gz" "$NCU_ID"
exit "$status"
