# measured by benchmarks/h200_kernels.py; paste into triton_w4a16.py / moe/triton_fused.py
SHAPE_PRESETS = {
    (4096, 6144): (
        (1, TileConfig(block_m=16, block_n=64, block_k=256, split_k=4, swap_ab=True)),
        (4, TileConfig(block_m=16, block_n=64, block_k=256, split_k=4, swap_ab=True)),
    ),
    (6144, 2048): (
        (1, TileConfig(block_m=16, block_n=64, block_k=512, split_k=2, num_stages=2, swap_ab=True)),
        (4, TileConfig(block_m=16, block_n=64, block_k=512, split_k=2, num_stages=2, swap_ab=True)),
    ),
    (8192, 8192): (
        (1, TileConfig(block_m=16, block_n=64, block_k=256, split_k=2, swap_ab=True)),
        (4, TileConfig(block_m=16, block_n=64, block_k=256, split_k=2, swap_ab=True)),
    ),
}
MOE_PRESETS = (
    (None, MoeTileConfig(block_m=32, block_k=128)),
)
