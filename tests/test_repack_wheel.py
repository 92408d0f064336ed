"""benchmarks/repack_wheel.py: the carried wheels it trims stay valid wheels (RECORD matches every
kept file) and a pattern that matches nothing stops the build instead of carrying the whole wheel."""

import base64
import csv
import hashlib
import io
import os
import sys
import zipfile

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import repack_wheel  # noqa: E402


def make_wheel(path):
    files = {"pkg/__init__.py": b"x = 1\n", "pkg/data/en.dat": b"en" * 100,
             "pkg/data/de.dat": b"de" * 100, "pkg/app.js.map": b"{}",
             "pkg-1.0.dist-info/METADATA": b"Name: pkg\n", "pkg-1.0.dist-info/x.dat": b"keep"}
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
        wheel.writestr("pkg-1.0.dist-info/RECORD", "stale\n")
    return path


def test_repacked_wheel_keeps_what_it_should_and_records_every_file(tmp_path):
    wheel = make_wheel(tmp_path / "pkg-1.0-py3-none-any.whl")
    out = repack_wheel.repack(wheel, tmp_path / "out", drop=["*.dat", "*.map"], keep=["pkg/data/en.dat"])
    with zipfile.ZipFile(out) as repacked:
        names = set(repacked.namelist())
        assert names == {"pkg/__init__.py", "pkg/data/en.dat", "pkg-1.0.dist-info/METADATA",
                         "pkg-1.0.dist-info/x.dat", "pkg-1.0.dist-info/RECORD"}   # dist-info is never dropped
        rows = list(csv.reader(io.StringIO(repacked.read("pkg-1.0.dist-info/RECORD").decode())))
        assert {row[0] for row in rows} == names
        for name, digest, size in rows:
            if name.endswith("RECORD"):
                assert digest == size == ""
                continue
            data = repacked.read(name)
            assert digest == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert int(size) == len(data)


def test_a_pattern_matching_nothing_stops_the_build(tmp_path):
    wheel = make_wheel(tmp_path / "pkg-1.0-py3-none-any.whl")
    with pytest.raises(SystemExit, match="has its layout changed"):
        repack_wheel.repack(wheel, tmp_path / "out", drop=["*.css"], keep=[])
    with pytest.raises(SystemExit, match="would overwrite its source"):
        repack_wheel.repack(wheel, tmp_path, drop=["*.map"], keep=[])
