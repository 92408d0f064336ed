#!/usr/bin/env bash
# One device step: Nsight Compute over cuda-w4a16-moe's builds and anatomy stages at GLM-5 B = 512
# NVFP4 (benchmarks/ncu_cuda_moe.py): ncu's raw CSV, the launches' labels, the summary and the
# log under $OUT/ncu (one folder, so that a call that brings other files back can pack it).
#   run: bash benchmarks/ncu_cuda_moe.sh      (NCU_TIMEOUT_S=200: how long ncu may profile)
# The clocks are left as the board sets them (--clock-control none: ncu would otherwise lock them
# at base, and the kernel is timed at the boost clock everywhere else).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src
out=$OUT/ncu && mkdir -p $out
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $out/gpu.txt
s=$(date +%s)
timeout -k 5 ${NCU_TIMEOUT_S:-200} ncu --clock-control none --profile-from-start off --kernel-name fp4_moe_gemm --page raw --csv \
    --metrics "$(python3 benchmarks/ncu_profile.py --metrics)" \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats \
    --section WarpStateStats --section SchedulerStats --section Occupancy \
    --section MemoryWorkloadAnalysis --log-file $out/ncu-moe.csv \
    python3 benchmarks/ncu_cuda_moe.py --launches $out/launches.txt > $out/ncu-run.log 2>&1
echo "ncu: exit $? after $(( $(date +%s) - s )) s"; grep -v "^==PROF==" $out/ncu-run.log | tail -12
python3 benchmarks/ncu_cuda_moe.py --summary $out/ncu-moe.csv --launches $out/launches.txt \
    | tee $out/summary.txt
