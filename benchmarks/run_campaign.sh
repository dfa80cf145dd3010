#!/usr/bin/env bash
# Every benchmark of benchmarks/RESULTS.md, three runs each, one after the other: the campaign that measured it.
# Resumable: a finished run leaves <name>.<run>.done and is skipped; logs and --json files in benchmarks/campaign/
# (or $CAMPAIGN_DIR). Each run's start, end, exit status and load average go to campaign.log.
#   bash benchmarks/run_campaign.sh            # about 3 h on the 2-core development machine, most of it deployments
set -uo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
out=${CAMPAIGN_DIR:-benchmarks/campaign}
mkdir -p "$out"
load() { cut -d' ' -f1-3 /proc/loadavg; }
step() {  # name, then the command; one run
    local name=$1
    shift
    [ -f "$out/$name.done" ] && return 0
    echo "$(date -u +%H:%M:%S) start $name load $(load)" >>"$out/campaign.log"
    local start=$SECONDS rc=0
    "$@" >"$out/$name.log" 2>&1 || rc=$?
    echo "$(date -u +%H:%M:%S) end $name rc=$rc $((SECONDS - start))s load $(load)" >>"$out/campaign.log"
    [ "$rc" = 0 ] && touch "$out/$name.done"
}
bench() { local module=$1; shift; "$python" -m "benchmarks.$module" "$@"; }
for run in 1 2 3; do
    step "pricing.$run" bench bench_pricing
    step "profiles.$run" bench bench_profiles --sizes 100 1000 --json "$out/profiles.$run.json"
    step "pass_client.$run" bench bench_pass_client --sizes 1000 10000 --clients 20
    step "market_scale.$run" bench bench_market_scale --sizes 2000 --json "$out/market_scale.$run.json"
    step "local_step.$run" bench bench_local_step
done
for run in 1 2 3; do
    step "market_vs_training.$run" bench bench_market_vs_training --json "$out/market_vs_training.$run.json"
    step "memory.$run" bench bench_memory --json "$out/memory.$run.json"
done
step deployment bench bench_deployment --sizes 10 30 --runs 3 --json "$out/deployment.json" --keep "$out/deployment"
# N = 50 (--sizes 50) needs more cores than the development machine's 2: RESULTS.md section 9.
for run in 1 2 3; do
    step "secagg.$run" bench bench_secagg --sizes 100 1000 --json "$out/secagg.$run.json"
    step "ledger.$run" bench bench_ledger
    step "dp.$run" bench bench_dp --noise-seed $((run - 1))   # three draws of the noise
    step "pass_scale.$run" bench bench_pass_scale --quick
done
for run in 1 2 3; do
    step "relaunch.$run" bench bench_market_vs_training --market-only --secure --json "$out/relaunch.$run.json"
    step "profiles300.$run" bench bench_profiles --sizes 300 --secure-whole-max 300 --json "$out/profiles300.$run.json"
    step "pass.$run" bench bench_pass
    step "award_checks.$run" bench bench_award_checks --sizes 1000 10000 --runs 1
    step "signature_check.$run" bench bench_signature_check --runs 1
done
echo "$(date -u +%H:%M:%S) campaign finished" >>"$out/campaign.log"
