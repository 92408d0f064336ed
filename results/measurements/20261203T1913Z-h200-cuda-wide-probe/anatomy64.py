# the script call 78 ran as /tmp/an.py (PYTHONPATH=src, from the repository root): the anatomy
# stages of two builds at 8192x8192 NVFP4 M = 64, each gated, then timed
import sys
sys.path.insert(0, 'benchmarks')
import tune_w4a16 as tune
from fp4lab.backends import cuda_w4a16 as cw
from fp4lab.backends.cuda_w4a16 import CudaTileConfig
dev = 'cuda'; timer = tune.device_timer(); weights = {}
for cfg in (CudaTileConfig(groups=8, depth=4, warps=8, min_ctas=2, overlap='tail'),
            CudaTileConfig(groups=8, depth=4, warps=8, min_ctas=2, overlap='tail', cluster=16)):
    p = tune.Point('nvfp4', 8192, 8192, 64); a, w = tune.operands(p, dev, weights)
    for v in cw.anatomy_variants(a, w, dev, config=cfg):
        row = tune.gate_and_time(lambda: v.prepared, lambda _: v.check(), timer, dev)
        print(cfg.label(), v.stage, row['status'], round(row.get('median_us', float('nan')), 2), flush=True)
