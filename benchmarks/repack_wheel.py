"""Repack a wheel without some of its files, as a valid wheel (RECORD rewritten), so that the wheel
folders carried to the offline H200 stay under the carry limit (benchmarks/device_wheels.sh).

    python benchmarks/repack_wheel.py WHEEL OUT_DIR --drop GLOB [--drop GLOB ...] [--keep GLOB ...]

A file (its path inside the wheel, fnmatch syntax, `*` also matching `/`) is dropped when it
matches a --drop pattern and no --keep pattern. The `.dist-info` folder is never dropped. Writes
OUT_DIR/<the same wheel name>; every kept file keeps its bytes, and RECORD is written afresh (a
sha256 and size for each kept file, its own line empty; `rewrite`, which
benchmarks/pack_flashinfer.py uses too).
Fails when nothing matched (the wheel's layout changed: check the patterns). stdlib only.

    # babel with only the English and root locale data (what sphinx needs for language "en")
    python benchmarks/repack_wheel.py babel-*.whl OUT --drop 'babel/locale-data/*.dat' \
        --keep 'babel/locale-data/en.dat' --keep 'babel/locale-data/en_*.dat' \
        --keep 'babel/locale-data/root.dat'
"""

from __future__ import annotations

import argparse
import base64
import csv
import fnmatch
import hashlib
import io
import zipfile
from pathlib import Path
from typing import Callable


def record_line(name: str, data: bytes) -> list[str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [name, f"sha256={digest}", str(len(data))]


def rewrite(source: zipfile.ZipFile, out_path, record_name: str,
            kept: Callable[[str], bool]) -> tuple[int, int, int]:
    """Write the files of `source` for which `kept(name)` holds to `out_path`, bytes unchanged,
    with RECORD written afresh; (files kept, files dropped, bytes dropped unpacked)."""
    rows, n_dropped, bytes_dropped = [], 0, 0
    with zipfile.ZipFile(out_path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as out:
        for info in source.infolist():
            if info.filename == record_name or info.is_dir():
                continue
            if not kept(info.filename):
                n_dropped += 1
                bytes_dropped += info.file_size
                continue
            data = source.read(info)
            out.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
            rows.append(record_line(info.filename, data))
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows(rows + [[record_name, "", ""]])
        out.writestr(record_name, text.getvalue())
    return len(rows), n_dropped, bytes_dropped


def repack(wheel: Path, out_dir: Path, drop: list[str], keep: list[str]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    out_path = out_dir / wheel.name
    if out_path.resolve() == wheel.resolve():
        raise SystemExit(f"repack_wheel: {out_path} would overwrite its source: use another OUT_DIR")
    source = zipfile.ZipFile(wheel)
    records = [name for name in source.namelist() if name.endswith(".dist-info/RECORD")]
    if len(records) != 1:
        raise SystemExit(f"repack_wheel: {wheel.name} has {len(records)} .dist-info/RECORD files")
    record_name = records[0]
    dist_info = record_name.rsplit("/", 1)[0] + "/"

    def dropped(name: str) -> bool:
        if name.startswith(dist_info):
            return False
        return (any(fnmatch.fnmatchcase(name, pattern) for pattern in drop)
                and not any(fnmatch.fnmatchcase(name, pattern) for pattern in keep))

    n_kept, n_dropped, bytes_dropped = rewrite(source, out_path, record_name,
                                               lambda name: not dropped(name))
    if n_dropped == 0:
        out_path.unlink()
        raise SystemExit(f"repack_wheel: no file of {wheel.name} matches {drop} (less {keep}): "
                         f"has its layout changed?")
    print(f"repack_wheel: {wheel.name}: kept {n_kept} files, dropped {n_dropped} "
          f"({bytes_dropped / 2**20:.1f} MiB unpacked); {wheel.stat().st_size / 2**20:.1f} -> "
          f"{out_path.stat().st_size / 2**20:.1f} MiB")
    return out_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheel", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--drop", action="append", required=True, metavar="GLOB")
    parser.add_argument("--keep", action="append", default=[], metavar="GLOB")
    args = parser.parse_args()
    repack(args.wheel, args.out_dir, args.drop, args.keep)


if __name__ == "__main__":
    main()
