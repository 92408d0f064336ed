#!/usr/bin/env bash
# device call 147 (session 41). On an H200: the reference run's cuda-w4a16-moe rows with the
# adopted k loop (h200_cuda_moe.sh sweep, both formats, no GPU tests). On any other GPU: Nsight
# Compute over humming-w4a16, triton-w4a16 and cuda-w4a16 at 8192x8192 M=64 NVFP4
# (benchmarks/ncu_profile.py --m64), a profile folder not for the book (run.json for_book false).
# Everything lands in one tarball: a call brings back at most 8 files.
set -u
start=$(date +%s); W=/tmp/w147; mkdir -p $W
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $gpu"
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader > $W/gpu.txt
export PYTHONUNBUFFERED=1 FP4LAB_GIT_SHA=14f8d774d2d129742bf1986de4824aa8667d70f1 HUMMING_CACHE_DIR=/tmp/humming-cache
if echo "$gpu" | grep -q H200; then
    mkdir -p $W/moe
    OUT=$W/moe GPU_TESTS=0 timeout -k 5 560 bash benchmarks/h200_cuda_moe.sh 14f8d774d2d129742bf1986de4824aa8667d70f1 sweep > $W/moe/call.log 2>&1
    echo "moe sweep: exit $? at $(( $(date +%s) - start )) s"; tail -40 $W/moe/call.log
else
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/fp4libs/*.whl
    F=$W/20261207T1040Z-h100-ncu-m64; mkdir -p $F
    which ncu; ncu --version | tail -1
    metrics="$(PYTHONPATH=src python3 benchmarks/ncu_profile.py --metrics)"
    PYTHONPATH=src:/tmp/site timeout -k 5 420 ncu --clock-control none --profile-from-start off --csv --page raw         --metrics "$metrics" --log-file $F/raw.csv python3 benchmarks/ncu_profile.py --m64 > $F/ncu-run.log 2>&1
    echo "ncu: exit $? at $(( $(date +%s) - start )) s"; grep -v Warning $F/ncu-run.log | tail -8
    PYTHONPATH=src python3 benchmarks/ncu_profile.py --m64 --describe --launches $F/launches.json
    NCU_VERSION="$(ncu --version | tail -1)" python3 - $F <<'PY'
import json, os, subprocess, sys
import torch, triton
folder = sys.argv[1]
smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,power.limit", "--format=csv,noheader,nounits"],
                     capture_output=True, text=True).stdout.split(",")
props = torch.cuda.get_device_properties(0)
json.dump({"run_id": os.path.basename(folder), "profiled": "m64", "for_book": False,
           "what": "Nsight Compute over humming-w4a16, triton-w4a16 and cuda-w4a16 (their presets) at 8192x8192 "
                   "M=64 NVFP4, one gated launch each (benchmarks/ncu_profile.py --m64): where the fastest peer "
                   "and fp4lab's kernels differ at M = 64 (device call 147, benchmarks/NOTES.md)",
           "provenance": {"machine": props.name, "sms": props.multi_processor_count,
                          "driver": smi[0].strip(), "power_limit_w": smi[1].strip() if len(smi) > 1 else None,
                          "torch": torch.__version__, "triton": triton.__version__, "humming_kernels": "0.1.20",
                          "ncu": os.environ.get("NCU_VERSION"), "fp4lab_git_sha": os.environ["FP4LAB_GIT_SHA"],
                          "command": "ncu --clock-control none --profile-from-start off --csv --page raw "
                                     "--metrics $(ncu_profile.py --metrics) python3 benchmarks/ncu_profile.py --m64"}},
          open(os.path.join(folder, "run.json"), "w"), indent=2)
PY
    head -c 600 $F/raw.csv; echo; wc -l $F/raw.csv
fi
tar -C $W -czf $OUT/call147.tar.gz .
echo "done at $(( $(date +%s) - start )) s"
