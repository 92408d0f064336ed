#!/usr/bin/env bash
# device call 152 (session 43; planned as call 149 in session 42). On an H200: the reference run's cuda-w4a16-moe rows with the
# adopted k loop (h200_cuda_moe.sh sweep, NVFP4: the diagnosed format, no GPU tests). On any other GPU: Nsight
# Compute over humming-w4a16, triton-w4a16 and cuda-w4a16 at 8192x8192 M=64 NVFP4, then the Triton
# preset with 8 warps on its tile (benchmarks/ncu_profile.py --m64), a profile folder not for the
# book (run.json for_book false). Then on either: tune_w4a16.py over
# benchmarks/configs/m64_wave_probe.json (M=64 splits that fill one wave at three 4-warp CTAs an SM,
# and stream-K grids of 2 and 3 CTAs an SM), then stream-K at M=1 and 16 beside the presets
# (benchmarks/configs/decode_stream_k_probe.json).
# Everything lands in one tarball: a call brings back at most 8 files.
set -u
start=$(date +%s); W=/tmp/w152; mkdir -p $W
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $gpu"
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader > $W/gpu.txt
export PYTHONUNBUFFERED=1 FP4LAB_GIT_SHA=28dd8da476a9ef22f5ff7785bd7b271e9bb68542 HUMMING_CACHE_DIR=/tmp/humming-cache
if echo "$gpu" | grep -q H200; then
    mkdir -p $W/moe
    OUT=$W/moe GPU_TESTS=0 FMTS=nvfp4 timeout -k 5 300 bash benchmarks/h200_cuda_moe.sh 28dd8da476a9ef22f5ff7785bd7b271e9bb68542 sweep > $W/moe/call.log 2>&1
    echo "moe sweep: exit $? at $(( $(date +%s) - start )) s"; tail -40 $W/moe/call.log
    # a sweep stopped by its timeout still leaves the rows it measured (moe-sweep resumes)
    cp -n /tmp/runs/20261203T1155Z-h200-full/{moe.parquet,moe.jsonl,moe_anatomy.parquet,moe_anatomy.jsonl,run.json} \
        $W/moe/ 2>/dev/null
else
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/fp4libs/*.whl
    F=$W/$(date -u +%Y%m%dT%H%MZ)-h100-ncu-m64-twin; mkdir -p $F
    which ncu; ncu --version | tail -1
    metrics="$(PYTHONPATH=src python3 benchmarks/ncu_profile.py --metrics)"
    PYTHONPATH=src:/tmp/site timeout -k 5 200 ncu --clock-control none --profile-from-start off --csv --page raw         --metrics "$metrics" --log-file $F/raw.csv python3 benchmarks/ncu_profile.py --m64 > $F/ncu-run.log 2>&1
    echo "ncu: exit $? at $(( $(date +%s) - start )) s"; grep -v Warning $F/ncu-run.log | tail -8
    PYTHONPATH=src python3 benchmarks/ncu_profile.py --m64 --describe --launches $F/launches.json
    NCU_VERSION="$(ncu --version | tail -1)" python3 - $F <<'PY'
import json, os, subprocess, sys
import torch, triton
folder = sys.argv[1]
smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,power.limit", "--format=csv,noheader,nounits"],
                     capture_output=True, text=True).stdout.split(",")
props = torch.cuda.get_device_properties(0)
json.dump({"run_id": os.path.basename(folder), "profiled": "m64-twin", "for_book": False,
           "what": "Nsight Compute over humming-w4a16, triton-w4a16 and cuda-w4a16 (their presets) at 8192x8192 "
                   "M=64 NVFP4, one gated launch each, then the Triton preset with 8 warps (benchmarks/ncu_profile.py --m64): where the fastest peer "
                   "and fp4lab's kernels differ at M = 64 (device call 152, benchmarks/NOTES.md)",
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
kind=$(echo "$gpu" | grep -q H200 && echo h200 || echo h100)
# the H200's MoE sweep leaves less of the call's 600 s to the probes
probe_s=$(echo "$gpu" | grep -q H200 && echo 110 || echo 150)
T=$W/$(date -u +%Y%m%dT%H%MZ)-$kind-m64-wave-probe; mkdir -p $T
PYTHONPATH=src:/tmp/site timeout -k 5 $((probe_s + 30)) python3 benchmarks/tune_w4a16.py --out $T --m 64 --formats nvfp4 \
    --budget-s $probe_s --configs benchmarks/configs/m64_wave_probe.json > $T/tune.log 2>&1
echo "wave probe: exit $? at $(( $(date +%s) - start )) s"; grep -v Warning $T/tune.log | tail -40
D=$W/$(date -u +%Y%m%dT%H%MZ)-$kind-decode-stream-k-probe; mkdir -p $D
PYTHONPATH=src:/tmp/site timeout -k 5 100 python3 benchmarks/tune_w4a16.py --out $D --m 1,16 --formats nvfp4 \
    --budget-s 70 --configs benchmarks/configs/decode_stream_k_probe.json > $D/tune.log 2>&1
echo "decode stream-K probe: exit $? at $(( $(date +%s) - start )) s"; grep -v Warning $D/tune.log | tail -30
tar -C $W -czf $OUT/call152.tar.gz .
echo "done at $(( $(date +%s) - start )) s"
