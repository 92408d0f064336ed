"""Device calls 154-155: why stream-K sk3 at 8192x8192 M=64 NVFP4 (TMA) returned 103 NaN elements on an
H100 (call 152) while every aligned stream-K grid passed. Each variant is called 3 times into a
NaN-filled output with its workspace NaN-filled (a slot read but never written shows as NaN),
then 3 times with the workspace zeroed; per call: NaN count, the bad 128-column tiles, the
relative error of the finite elements."""
import dataclasses, json, sys, torch
from fp4lab import formats
from fp4lab.backends import get
from fp4lab.backends.triton_w4a16 import TileConfig
from fp4lab.backends.triton_w4a16_kernel import Launch, stream_plan

torch.manual_seed(0)
rows = []


def probe(n, k, m, config, label):
    a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    w = formats.quantize(torch.randn(n, k, device="cuda") * k ** -0.5, "nvfp4")
    p = get("triton-w4a16").prepare(a, w, "cuda", config=config)
    launch = next(c.cell_contents for c in p.make_call.__closure__ if isinstance(c.cell_contents, Launch))
    ref = p.ref_a.double() @ p.ref_w.double().T
    for fill in (float("nan"), 0.0):
        for call in range(3):
            launch.workspace.fill_(fill)
            p.out.fill_(float("nan"))
            out = p.call()
            torch.cuda.synchronize()
            bad = ~torch.isfinite(out)
            err = ((out.double().nan_to_num(0) - ref) * (~bad)).norm() / ref.norm()
            tiles = sorted({c // config.block_n for c in bad.any(dim=0).nonzero().flatten().tolist()})
            row = {"label": label, "n": n, "k": k, "m": m, "ws_fill": str(fill), "call": call,
                   "grid": list(launch.grid), "steps_per_program": launch.blocks_per_split,
                   "slots": launch.workspace.shape[0], "nan": int(bad.sum()), "rel_err_finite": float(err),
                   "bad_tiles": tiles[:24], "bad_rows": bad.any(dim=1).nonzero().flatten().tolist()[:16]}
            rows.append(row)
            print(json.dumps(row), flush=True)


base = TileConfig(block_m=64, block_n=128, block_k=128, swap_ab=True, loads="tma", stream_k=3)
for n, k, m, config, label in [
    (4096, 47 * 128, 64, base, "K=47 blocks sk3 tma"),
    (4096, 47 * 128, 64, dataclasses.replace(base, loads="pointer"), "K=47 blocks sk3 pointer"),
    (4096, 47 * 128, 1, base, "K=47 blocks M=1 sk3 tma"),
    (8192, 8192, 64, base, "sk3 tma st3"),
    (8192, 8192, 64, base, "sk3 tma st3 again"),
]:
    try:
        probe(n, k, m, config, label)
    except Exception as exc:  # noqa: BLE001 - a variant that cannot run is a result
        print(json.dumps({"label": label, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}), flush=True)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
