# measured by benchmarks/h200_kernels.py; paste into triton_w4a16.py / moe/triton_fused.py
SHAPE_PRESETS = {
    (4096, 6144): (
        (1, TileConfig(block_m=16, block_n=64, block_k=256, split_k=4, swap_ab=True, layout='tiles')),
        (4, TileConfig(block_m=16, block_n=64, block_k=256, split_k=4, swap_ab=True, layout='tiles')),
        (16, TileConfig(block_m=16, block_n=64, block_k=256, split_k=4, swap_ab=True, layout='tiles')),
        (64, TileConfig(block_m=64, block_n=128, block_k=128, split_k=8, swap_ab=True, loads='tma')),
        (256, TileConfig(block_m=128, block_n=128, block_k=128, split_k=4, num_warps=8, swap_ab=True, loads='tma')),
    ),
    (6144, 2048): (
        (1, TileConfig(block_m=16, block_n=32, block_k=256, num_warps=2, num_stages=4, swap_ab=True, layout='tiles')),
        (4, TileConfig(block_m=16, block_n=32, block_k=256, num_warps=2, num_stages=4, swap_ab=True, layout='tiles')),
        (16, TileConfig(block_m=16, block_n=32, block_k=256, num_warps=2, swap_ab=True, layout='tiles')),
        (64, TileConfig(block_m=64, block_n=128, block_k=128, split_k=5, swap_ab=True, loads='tma')),
        (256, TileConfig(block_m=128, block_n=128, block_k=128, split_k=2, num_warps=8, swap_ab=True, loads='tma')),
    ),
    (8192, 8192): (
        (1, TileConfig(block_m=16, block_n=128, block_k=256, split_k=4, swap_ab=True, loads='tma', layout='tiles')),
        (4, TileConfig(block_m=16, block_n=128, block_k=256, split_k=4, swap_ab=True, loads='tma', layout='tiles')),
        (16, TileConfig(block_m=16, block_n=128, block_k=256, split_k=4, swap_ab=True, loads='tma', layout='tiles')),
        (64, TileConfig(block_m=64, block_n=128, block_k=128, split_k=4, swap_ab=True, loads='tma')),
        (256, TileConfig(block_m=128, block_n=128, block_k=128, split_k=2, num_warps=8, swap_ab=True, loads='tma')),
    ),
}
MOE_PRESETS = (
    (2.0, MoeTileConfig(block_k=128, loads='tma')),
    (None, MoeTileConfig(block_m=32, block_k=128, loads='tma')),
)
