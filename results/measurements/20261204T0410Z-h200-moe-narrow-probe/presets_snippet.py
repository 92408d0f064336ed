# measured by benchmarks/h200_kernels.py; paste into triton_w4a16.py / moe/triton_fused.py
SHAPE_PRESETS = {
}
MOE_PRESETS = (
    (2.0, MoeTileConfig(block_k=128, num_stages=2, loads='tma')),
    (None, MoeTileConfig(block_m=32, block_k=128, loads='tma')),
)
