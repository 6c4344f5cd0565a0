#!/usr/bin/env bash
# Screenshot of an MLflow experiment's runs table, as a browser shows it, from a local store.
#
#   scripts/mlflow_ui_screenshot.sh sqlite:///outputs/mlflow.db compare_methods runs.png
#
# Starts `mlflow server` on a free 127.0.0.1 port over the store (artifacts are read from where the runs put them),
# opens the experiment in headless Chromium (Debian: `apt-get install -y chromium`) and writes a 1400x900 PNG, then
# stops the server. The page is the experiment's "Model training" view (`?workflowType=machine_learning`): MLflow
# 3.17's UI opens every experiment in its GenAI view unless the URL or the browser's saved choice says otherwise.
# Environment: MLFLOW (the mlflow command; default: the one beside $PYTHON, else on PATH), PYTHON (default python3),
# CHROMIUM (default chromium), BUDGET_MS (virtual time Chromium lets the page load, default 15000), DOM_OUT (also
# write the rendered page's HTML there, for tests to read the runs table).
set -euo pipefail

if [[ $# -ne 3 ]]; then
    echo "usage: $0 BACKEND_STORE_URI EXPERIMENT_NAME OUT.png" >&2
    exit 2
fi
store=$1 experiment=$2 out=$3
python=${PYTHON:-python3}
mlflow=${MLFLOW:-$(dirname "$(command -v "$python")")/mlflow}
[[ -x $mlflow ]] || mlflow=$(command -v mlflow) || { echo "mlflow not found: set MLFLOW=/path/to/mlflow" >&2; exit 2; }
chromium=${CHROMIUM:-chromium}
command -v "$chromium" >/dev/null || { echo "$chromium not found: apt-get install -y chromium" >&2; exit 2; }

port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
url=http://127.0.0.1:$port
work=$(mktemp -d)
server_pid=
cleanup() {
    if [[ -n $server_pid ]]; then
        kill -TERM -- "-$server_pid" 2>/dev/null || true
        for _ in $(seq 20); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.5; done
        kill -KILL -- "-$server_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

set -m  # the server gets its own process group (id $server_pid): cleanup stops it with all its workers
MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false MLFLOW_DISABLE_TELEMETRY=true "$mlflow" server \
    --backend-store-uri "$store" --host 127.0.0.1 --port "$port" --workers 1 >"$work/server.log" 2>&1 &
server_pid=$!
set +m
for _ in $(seq 180); do
    curl -sf "$url/health" >/dev/null && break
    kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.log" >&2; echo "mlflow server exited" >&2; exit 1; }
    sleep 0.5
done
curl -sf "$url/health" >/dev/null || { cat "$work/server.log" >&2; echo "mlflow server not healthy in 90 s" >&2; exit 1; }

experiment_id=$(curl -sf --get --data-urlencode "experiment_name=$experiment" \
    "$url/api/2.0/mlflow/experiments/get-by-name" | "$python" -c 'import json, sys; print(json.load(sys.stdin)["experiment"]["experiment_id"])') \
    || { echo "no experiment named '$experiment' in $store" >&2; exit 1; }

"$chromium" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
    --disable-component-update --disable-sync --user-data-dir="$work/profile" --screenshot="$out" \
    --window-size=1400,900 --virtual-time-budget="${BUDGET_MS:-15000}" \
    "$url/#/experiments/$experiment_id?workflowType=machine_learning" >"$work/chromium.log" 2>&1 \
    || { cat "$work/chromium.log" >&2; exit 1; }
[[ -s $out ]] || { cat "$work/chromium.log" >&2; echo "chromium wrote no screenshot" >&2; exit 1; }
if [[ -n ${DOM_OUT:-} ]]; then
    "$chromium" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
        --disable-component-update --disable-sync --user-data-dir="$work/profile" --dump-dom \
        --window-size=1400,900 --virtual-time-budget="${BUDGET_MS:-15000}" \
        "$url/#/experiments/$experiment_id?workflowType=machine_learning" >"$DOM_OUT" 2>"$work/chromium.log" \
        || { cat "$work/chromium.log" >&2; exit 1; }
fi
echo "$out: experiment '$experiment' ($url/#/experiments/$experiment_id)"
