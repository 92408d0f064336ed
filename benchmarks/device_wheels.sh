#!/usr/bin/env bash
# Build the two wheel folders that device calls carry to the offline NVIDIA H200 machine:
#
#   .whl/report   every distribution `make report` (scripts/setup_env.sh: the project's dependencies
#                 plus its `test` extra, offline with PIP_NO_INDEX=1
#                 PIP_FIND_LINKS=".whl/report .whl/fp4libs", a venv --system-site-packages over the
#                 image's Python 3.12) needs and the device image lacks: papermill, ipykernel,
#                 nbformat, jupyter-book 1.0.4.post1 and their needs, as py3.12 manylinux/any wheels,
#                 one version each; plus the image-held distributions whose image version may not
#                 satisfy what we carry (markdown-it-py 3.x for the myst stack, say)
#   .whl/fp4libs  the `gpu` extra's libraries that are carried: humming-kernels 0.1.20 (PyPI wheel)
#                 and gemlite 0.6.0.post2 (built here from its sdist, pure Python), without their deps
#
# Why: the H200 machine has no network, and a call may carry at most 64 MiB (working tree plus the
# carried folders; the tree is ~27 MiB). So wheels of what the image already holds are left out,
# and two wheels are repacked smaller (benchmarks/repack_wheel.py): babel with only its `en*` and
# `root` locale data, pydata-sphinx-theme without its `.map` files.
#
#   bash benchmarks/device_wheels.sh
#
# Rebuilds both folders from scratch (idempotent), prints their files and sizes, and fails if the
# tree plus the folders exceed the carry limit. Needs network (PyPI) and a Python 3.12 interpreter
# with pip (PYTHON312, else python3.12 or python3 if it is 3.12, else a pyenv 3.12): pip evaluates
# environment markers against the interpreter it runs in, whatever --python-version says.
# Knobs (environment variables):
#   PYTHON312     the Python 3.12 to resolve and download with
#   IMAGE_FREEZE  a `python3 -m pip list --format=freeze` of the device image: what it holds, and
#                 in which versions (default benchmarks/device_image_freeze.txt, read on the H200
#                 on 2026-12-02; one device call renews it: `python3 -m pip list --format=freeze >
#                 $OUT/image-freeze.txt`). An image-held distribution is carried exactly when the
#                 image's version fails a requirement of the project or of what is carried.
#   CARRY_LIMIT_MIB  the limit on tree + folders (default 64)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
REPORT_DIR=.whl/report
FP4LIBS_DIR=.whl/fp4libs
JUPYTER_BOOK_PIN="jupyter-book==1.0.4.post1"
FP4LIBS_WHEELS=("humming-kernels==0.1.20")   # downloaded as wheels, --no-deps
FP4LIBS_SDISTS=("gemlite==0.6.0.post2")      # built into wheels here, --no-deps
CARRY_LIMIT_MIB=${CARRY_LIMIT_MIB:-64}
IMAGE_FREEZE=${IMAGE_FREEZE-}
[ -n "${IMAGE_FREEZE}" ] || IMAGE_FREEZE=benchmarks/device_image_freeze.txt
# never carried, whatever they need: the image's own torch stack and packaging tools
NEVER_CARRY="torch triton nvidia-* pip setuptools wheel"
# wheels for CPython 3.12 on x86_64 manylinux (the image's glibc takes manylinux_2_28)
TARGET=(--python-version 3.12 --implementation cp --abi cp312 --only-binary=:all:
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
        --platform manylinux2014_x86_64 --platform any)

say() { echo "==> $*"; }
die() { echo "device_wheels: error: $*" >&2; exit 1; }

find_python312() {
    local candidate
    for candidate in "${PYTHON312:-}" python3.12 python3; do
        [ -n "$candidate" ] || continue
        if "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
            command -v "$candidate"; return 0
        fi
    done
    if command -v pyenv >/dev/null 2>&1; then
        for candidate in "$(pyenv root)"/versions/3.12*/bin/python3.12; do
            [ -x "$candidate" ] && { echo "$candidate"; return 0; }
        done
    fi
    return 1
}
[ -n "${PYTHON312:-}" ] && ! "$PYTHON312" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null \
    && die "PYTHON312=$PYTHON312 is not a working Python 3.12"
PY=$(find_python312) || die "no Python 3.12 found: set PYTHON312 (pip evaluates markers against its own Python)"
"$PY" -m pip --version >/dev/null 2>&1 || die "$PY has no pip"
[ -f "$IMAGE_FREEZE" ] || die "IMAGE_FREEZE=$IMAGE_FREEZE: no such file"
pip() { "$PY" -m pip --disable-pip-version-check "$@"; }
say "resolving with $PY ($("$PY" -m pip --version | cut -d' ' -f1-2)); image from $IMAGE_FREEZE"

# -- keep the folders untracked ---------------------------------------------------------------------
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
touch "$exclude"
grep -qxF '/.whl/' "$exclude" || { echo '/.whl/' >> "$exclude"; say "added /.whl/ to $exclude"; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/device-wheels.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# -- the requirement set: what setup_env.sh installs, less what is never carried --------------------
"$PY" scripts/project_requirements.py test > "$WORK/project.txt"
"$PY" - "$WORK/project.txt" "$NEVER_CARRY" > "$WORK/top.txt" <<'EOF'
import fnmatch, re, sys
never = sys.argv[2].split()
for line in open(sys.argv[1]).read().split("\n"):
    name = re.split(r"[\s<>=!~;\[]", line, maxsplit=1)[0].lower().replace("_", "-").replace(".", "-")
    if line.strip() and not any(fnmatch.fnmatchcase(name, pattern) for pattern in never):
        print(line)
EOF
echo "$JUPYTER_BOOK_PIN" > "$WORK/constraints.txt"
say "requirements: $(tr '\n' ' ' < "$WORK/top.txt")(constraint $JUPYTER_BOOK_PIN)"

# Resolve the whole graph for py3.12 without installing; PyPI's metadata files keep the big wheels
# (numpy, pyarrow, ...) from being downloaded.
pip install -q --dry-run --ignore-installed --target "$WORK/never" --report "$WORK/resolved.json" \
    "${TARGET[@]}" -c "$WORK/constraints.txt" -r "$WORK/top.txt"

# -- what to carry: the resolved distributions the image lacks, and the image-held ones it may not
#    hold in a version that satisfies them ----------------------------------------------------------
"$PY" - "$WORK/resolved.json" "$WORK/top.txt" "$NEVER_CARRY" "$IMAGE_FREEZE" \
    > "$WORK/carry.txt" <<'EOF'
import fnmatch, json, re, sys
try:
    from packaging.requirements import Requirement
    from packaging.version import Version
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.version import Version

def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()

report, top_file, never, freeze_file = sys.argv[1:5]
never = never.split()
never_carry = lambda name: any(fnmatch.fnmatchcase(name, pattern) for pattern in never)
image_version = {}                 # the freeze: every distribution the image holds, its version
for line in open(freeze_file):
    if "==" in line:
        name, version = line.strip().split("==", 1)
        image_version[norm(name)] = Version(version)
held = lambda name: name in image_version

resolved = {}
for item in json.load(open(report))["install"]:
    meta = item["metadata"]
    extras = [""] + list(item.get("requested_extras") or [])
    requires = []
    for text in meta.get("requires_dist") or []:
        requirement = Requirement(text)
        if requirement.marker is None or any(requirement.marker.evaluate({"extra": e}) for e in extras):
            requires.append(requirement)
    resolved[norm(meta["name"])] = (meta["version"], requires)
top = [Requirement(line) for line in open(top_file).read().split("\n") if line.strip()]

def fails(name, specifier):
    """Does the image's version of `name` fail `specifier`?"""
    return bool(str(specifier)) and not specifier.contains(image_version[name], prereleases=True)

carry = {name for name in resolved if not held(name) and not never_carry(name)}
reasons = {}
changed = True
while changed:   # a carried image-held distribution brings its own requirements into the check
    changed = False
    demands = [(req, "the project") for req in top]
    demands += [(req, f"{name} {resolved[name][0]}") for name in sorted(carry) for req in resolved[name][1]]
    for requirement, who in demands:
        name = norm(requirement.name)
        if name in carry or not held(name) or not fails(name, requirement.specifier):
            continue
        have = image_version[name]
        if never_carry(name):
            print(f"device_wheels: warning: {who} needs {requirement}, the image has {name} {have}, "
                  f"which is never carried", file=sys.stderr)
            continue
        if name not in resolved:
            sys.exit(f"device_wheels: {who} needs {requirement} but the resolver chose no {name}")
        carry.add(name)
        reasons[name] = f"{who} needs {requirement.name}{requirement.specifier} (image: {have})"
        changed = True
for name, why in sorted(reasons.items()):
    print(f"    carrying image-held {name} {resolved[name][0]}: {why}", file=sys.stderr)
for name in sorted(carry):
    print(f"{name}=={resolved[name][0]}")
EOF
say "resolved $("$PY" -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["install"]))' "$WORK/resolved.json") distributions; carrying $(wc -l < "$WORK/carry.txt")"

# -- .whl/report -------------------------------------------------------------------------------------
rm -rf "$REPORT_DIR" "$FP4LIBS_DIR"
mkdir -p "$REPORT_DIR" "$FP4LIBS_DIR" "$WORK/download"
pip download -q --no-deps -d "$WORK/download" "${TARGET[@]}" -r "$WORK/carry.txt"
for wheel in "$WORK/download"/*.whl; do
    case "$(basename "$wheel")" in
        babel-*|Babel-*)
            "$PY" benchmarks/repack_wheel.py "$wheel" "$REPORT_DIR" --drop 'babel/locale-data/*.dat' \
                --keep 'babel/locale-data/en.dat' --keep 'babel/locale-data/en_*.dat' \
                --keep 'babel/locale-data/root.dat' ;;
        pydata_sphinx_theme-*)
            "$PY" benchmarks/repack_wheel.py "$wheel" "$REPORT_DIR" --drop '*.map' ;;
        *) cp "$wheel" "$REPORT_DIR/" ;;
    esac
done
ls "$WORK/download" | grep -v '\.whl$' && die "pip downloaded something that is not a wheel (above)"

# -- .whl/fp4libs ------------------------------------------------------------------------------------
pip download -q --no-deps -d "$FP4LIBS_DIR" "${TARGET[@]}" "${FP4LIBS_WHEELS[@]}"
# pure Python: the wheel it builds (py3-none-any) is the same whichever Python builds it
sdist_names=$(printf '%s\n' "${FP4LIBS_SDISTS[@]}" | sed 's/[<>=!~ ;[].*//' | paste -sd, -)
pip wheel -q --no-deps --no-binary "$sdist_names" -w "$FP4LIBS_DIR" "${FP4LIBS_SDISTS[@]}"

# -- checks: one version of each distribution, every wheel installable on cp312 manylinux x86_64 ----
"$PY" - "$REPORT_DIR" "$FP4LIBS_DIR" "$WORK/carry.txt" "${FP4LIBS_WHEELS[@]}" "${FP4LIBS_SDISTS[@]}" <<'EOF'
import re, sys, zipfile
from pathlib import Path
try:
    from packaging.tags import sys_tags
    from packaging.utils import canonicalize_name, parse_wheel_filename
except ImportError:
    from pip._vendor.packaging.tags import sys_tags
    from pip._vendor.packaging.utils import canonicalize_name, parse_wheel_filename
report, fp4libs, carry_file, *fp4_pins = sys.argv[1:]
# this interpreter is a CPython 3.12 (checked above); the device takes manylinux_2_28 and older
ok_platforms = {"any"} | {f"manylinux_2_{m}_x86_64" for m in range(5, 29)} | {"manylinux2014_x86_64", "manylinux1_x86_64", "manylinux2010_x86_64"}
ok = {(t.interpreter, t.abi) for t in sys_tags()} | {("py3", "none"), ("py312", "none"), ("cp312", "none")}
seen, errors = {}, []
for folder in (report, fp4libs):
    for wheel in sorted(Path(folder).iterdir()):
        if wheel.suffix != ".whl":
            errors.append(f"{wheel}: not a wheel"); continue
        name, version, _, tags = parse_wheel_filename(wheel.name)
        if name in seen:
            errors.append(f"{name}: two wheels ({seen[name]}, {wheel.name})")
        seen[name] = wheel.name
        if not any((t.interpreter, t.abi) in ok and t.platform in ok_platforms for t in tags):
            errors.append(f"{wheel.name}: not installable on cp312 manylinux_2_28_x86_64")
        with zipfile.ZipFile(wheel) as z:
            if z.testzip() is not None or not any(n.endswith(".dist-info/RECORD") for n in z.namelist()):
                errors.append(f"{wheel.name}: a broken wheel")
wanted = [line.split("==")[0] for line in open(carry_file).read().split()] + [p.split("==")[0] for p in fp4_pins]
missing = [name for name in wanted if canonicalize_name(name) not in seen]
if missing:
    errors.append(f"no wheel for {missing}")
if errors:
    sys.exit("device_wheels: error:\n  " + "\n  ".join(errors))
EOF

# -- sizes -----------------------------------------------------------------------------------------
say "wheels:"
for folder in "$REPORT_DIR" "$FP4LIBS_DIR"; do
    ls -l "$folder" | awk -v d="$folder" 'NR > 1 { printf "  %8.1f KiB  %s/%s\n", $5 / 1024, d, $9 }'
done
bytes() { du -cb "$@" | tail -n1 | cut -f1; }
report_b=$(bytes "$REPORT_DIR") fp4libs_b=$(bytes "$FP4LIBS_DIR")
tree_b=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -n1 | cut -f1)
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
say "$REPORT_DIR $(mib "$report_b") ($(ls "$REPORT_DIR" | wc -l) wheels), $FP4LIBS_DIR $(mib "$fp4libs_b")" \
    "($(ls "$FP4LIBS_DIR" | wc -l) wheels): $(mib $((report_b + fp4libs_b))); with the working tree" \
    "($(mib "$tree_b")): $(mib $((tree_b + report_b + fp4libs_b))) of the ${CARRY_LIMIT_MIB} MiB a call may carry"
du -sh "$REPORT_DIR" "$FP4LIBS_DIR"
if [ $((tree_b + report_b + fp4libs_b)) -gt $((CARRY_LIMIT_MIB * 1048576)) ]; then
    die "the working tree plus the wheel folders exceed ${CARRY_LIMIT_MIB} MiB: a call could not carry them"
fi
