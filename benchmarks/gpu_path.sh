#!/usr/bin/env bash
# The GPU path on a lent device machine (one GPU, 16 cores, Python 3.12 with CUDA torch; no flwr, ray or
# cryptography, no package index). Installs the wheels carried in .whl/ (`python -m benchmarks.device_wheels --dest
# .whl`: flwr and what the app needs beyond the machine's packages, Ray slimmed to fit) into /tmp/site, then runs
#   1. the README's main command with GPU client resources (client-resources-num-gpus=$GPU_SHARE, device='cuda');
#   2. the same command on the CPU cores (device='cpu', no GPU share), for the speed-up;
#   3. one engine job per arm (FLMarket, RS, DICE) of the Fashion-MNIST grid's protocol on one partition, on the GPU
#      (Fashion-MNIST when its files are there, else the bundled digits: the files do not fit in what travels);
# and writes to $OUT: summary.txt (the machine, the versions, what travelled, each part's wall time, the market's
# line, every round's accuracy, the proof that every ClientApp trained on the GPU, read from the run's own log),
# results.json, accuracy.png and the logs (main_gpu.log, main_cpu.log, engine.log).
#   bash benchmarks/gpu_path.sh                 # on the device machine, carrying .whl
#   bash benchmarks/gpu_path.sh --budget        # here, before the call: what travels, against 64 MiB (exit 1 over)
# On a machine without a GPU the same steps run on the CPU and every CUDA check reads "no GPU". Settings (environment):
# PYTHON (python3), WHEELS (.whl; empty: use PYTHON's own packages), SITE (/tmp/site, where they are installed),
# GPU_SHARE (0.1), SUPERNODES (20), ROUNDS (the app's num-server-rounds, 15), ENGINE_ROUNDS (30), ENGINE_WORKERS (3),
# PART_TIMEOUT (180 s for each flwr run, 20 s more for the engine), GPU_PATH_WORK (its scratch folder, removed at
# the end; default a new /tmp/gpu-path.*). Exit 1 when a part or a check fails. Everything it starts runs under its
# own FLWR_HOME and ports and is stopped by PID.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
python=${PYTHON:-python3}
wheels=${WHEELS-.whl}
if [ "${1:-}" = "--budget" ]; then
    exec "$python" -m benchmarks.gpu_path budget ${wheels:+--carry "$wheels"}
fi
out=${OUT:?OUT is the folder whose files come back}
gpu_share=${GPU_SHARE:-0.1}
supernodes=${SUPERNODES:-20}
rounds=${ROUNDS:-15}
engine_rounds=${ENGINE_ROUNDS:-30}
engine_workers=${ENGINE_WORKERS:-3}
part_timeout=${PART_TIMEOUT:-180}  # each flwr run; the engine gets 20 s more: all three within one 600 s device call
site=${SITE:-/tmp/site}
work=${GPU_PATH_WORK:-$(mktemp -d /tmp/gpu-path.XXXXXX)}  # short: Ray's socket paths live under it
status=0
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 FLWR_TELEMETRY_ENABLED=0 RAY_USAGE_STATS_ENABLED=0 \
    FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 RAY_DEDUP_LOGS=0

# What travelled (before anything is written here), then the carried wheels.
"$python" -m benchmarks.gpu_path budget ${wheels:+--carry "$wheels"} --json "$work/budget.json" || status=1
if [ -n "$wheels" ] && compgen -G "$wheels/*.whl" > /dev/null; then
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
        "$wheels"/*.whl || exit 1
    export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} PATH=$site/bin:$PATH
fi
cuda=$("$python" -c 'import torch; print(str(torch.cuda.is_available()).lower())') || exit 1
{
    date -u
    lscpu | grep 'Model name'
    echo "cores: $(nproc)"
    uptime
    command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    "$python" - << 'EOF'
import importlib.metadata as metadata, platform, torch
print("python", platform.python_version(), "| torch", torch.__version__, "CUDA", torch.version.cuda,
      "available", torch.cuda.is_available(), *(["|", torch.cuda.get_device_name(0)] if torch.cuda.is_available() else []))
print(" | ".join(f"{name} {metadata.version(name)}" for name in ("flwr", "ray", "numpy", "cryptography")))
EOF
} > "$work/machine.txt" 2>&1
cat "$work/machine.txt"

now() { date +%s%N; }
stop_home() {  # every process whose environment holds FLWR_HOME=$1 (SuperLink, SuperExec, simulation, Ray), by PID
    local pids=() entry pid
    for entry in /proc/[0-9]*/environ; do
        pid=${entry#/proc/}
        pid=${pid%/environ}
        grep -qzxF "FLWR_HOME=$1" "$entry" 2> /dev/null && pids+=("$pid")
    done
    [ "${#pids[@]}" -eq 0 ] && return 0
    kill -TERM "${pids[@]}" 2> /dev/null
    for _ in $(seq 20); do
        kill -0 "${pids[@]}" 2> /dev/null || return 0
        sleep 0.5
    done
    kill -KILL "${pids[@]}" 2> /dev/null || true
}
free_port() { "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
main_run() {  # arm, device, GPU share: the README's main command, its own FLWR_HOME and ports
    local arm=$1 device=$2 share=$3 home="$work/flwr-$1" started
    started=$(now)
    FLWR_HOME=$home FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=$(free_port) FLWR_LOCAL_CONTROL_API_PORT=$(free_port) \
        timeout "$part_timeout" flwr run . --stream \
        --federation-config "num-supernodes=$supernodes client-resources-num-cpus=1 client-resources-num-gpus=$share" \
        --run-config "device='$device' num-server-rounds=$rounds results-dir='$work/results' run-name='$arm' train-log-dir='$work/train-log/$arm'" \
        > "$out/main_$arm.log" 2>&1
    local rc=$?
    echo "main_$arm $(($(now) - started)) $rc" >> "$work/walls.txt"
    stop_home "$home"
    return "$rc"
}
trap 'stop_home "$work/flwr-gpu"; stop_home "$work/flwr-cpu"' EXIT

if [ "$cuda" = true ]; then
    main_run gpu cuda "$gpu_share" || status=1
else
    echo "no GPU: the GPU arm runs on the CPU (device='cpu', no GPU share); its CUDA checks read 'no GPU'"
    main_run gpu cpu 0 || status=1
fi
main_run cpu cpu 0 || status=1

if "$python" -c 'from flmarket_flwr.app.data.fashion_mnist import resolve_fashion_mnist_dir; resolve_fashion_mnist_dir()' \
    2> /dev/null; then
    data=(--dataset fashion_mnist --model fmnist_cnn)
else
    data=(--dataset digits --model digits_cnn)
fi
if [ "$cuda" = true ]; then
    on=(--device cuda --job-gpus "$(awk "BEGIN { print 0.9 / $engine_workers }")")
else
    on=(--device cpu)
fi
started=$(now)
OMP_NUM_THREADS=1 timeout $((part_timeout + 20)) "$python" -m simulations.engine --out "$work/engine" "${data[@]}" "${on[@]}" \
    --schedule linear --num-clients 20 --alpha 0.1 --rounds "$engine_rounds" --final-window $((engine_rounds < 10 ? engine_rounds : 10)) --local-steps 10 \
    --batch-size 32 --learning-rate 0.05 --momentum 0.9 --clip-norm 5.0 --distribution d4 --bid-policy volume \
    --budget-fraction 0.15 --num-selected 0 --selector flmarket rs dice --seed 0 --workers "$engine_workers" \
    > "$out/engine.log" 2>&1
rc=$?
echo "engine $(($(now) - started)) $rc" >> "$work/walls.txt"
[ "$rc" -eq 0 ] || status=1

"$python" -m benchmarks.gpu_path report --work "$work" --out "$out" --cuda "$cuda" || status=1
rm -rf "$work"
exit "$status"
