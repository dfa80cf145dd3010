#!/usr/bin/env bash
# benchmarks/bench_deployment.py on a lent device machine (16 cores, Python 3.12, no Flower): install the wheels
# carried in .whl/ (flwr and what it and the plugin need beyond the machine's own packages) into /tmp/site, then run
# the benchmark with its raw results, its table, the machine and its load written to $OUT.
#   bash benchmarks/device_deployment.sh --sizes 10 30 50 --runs 1
# Arguments go to the benchmark (default: --sizes 10 30 50 --runs 1). The --json file is rewritten after every run,
# so a run cut short by the call's time limit still returns what finished. Logs of every run: $OUT/logs.tar.gz.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:?OUT is the folder whose files come back}
python=${PYTHON:-python3}
[ "$#" -gt 0 ] || set -- --sizes 10 30 50 --runs 1

"$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
keep=/tmp/bench-deployment-logs
mkdir -p "$keep"
save_logs() { tar -czf "$out/logs.tar.gz" -C "$keep" . 2> /dev/null; }
trap save_logs EXIT

{
    echo "command: python -m benchmarks.bench_deployment $*"
    date -u
    lscpu | grep 'Model name'
    echo "cores: $(nproc)"
    uptime
    "$python" -c 'import flwr, sys; print("python", sys.version.split()[0], "flwr", flwr.__version__)'
} > "$out/machine.txt" 2>&1
cat "$out/machine.txt"

"$python" -m benchmarks.bench_deployment "$@" --json "$out/deployment.json" --keep "$keep" 2>&1 | tee "$out/table.txt"
status=${PIPESTATUS[0]}
uptime | tee -a "$out/machine.txt"
exit "$status"
