#!/usr/bin/env bash
# The pre-registered main grid (simulations/PILOT.md section 6): Fashion-MNIST, Dirichlet 0.1, d4-d6, 18 seeds each
# (54 partitions), FLMarket against RS, DICE, QBS and DDS in the budget mode under two bid policies, plus all the
# clients on every partition (the headroom each selector had).
# CLIENTS sets the federation size (default 20, the pre-registered grid in results/fashion_mnist_main/); any other
# size is a secondary, exploratory grid, not pre-registered, in results/fashion_mnist_c$CLIENTS/, with the same
# protocol otherwise (alpha, rounds, budget fractions, bid policies).
# Resumable (the engine skips finished jobs); one job at a time; logs in <results>/raw/*.log.
#   nice -n 15 bash simulations/fashion_mnist_main.sh            # all 18 seeds
#   nice -n 15 bash simulations/fashion_mnist_main.sh 0 5        # seeds 0-5 only (a stopped grid is seed-complete)
#   CLIENTS=100 nice -n 19 bash simulations/fashion_mnist_main.sh 0 2   # the 100-client grid, seeds 0-2
# Seeds run in chunks of two, every arm of a chunk before the next, so that a grid stopped anywhere holds whole
# partitions: every arm on the same seeds.
# Archive: tar -czf <results>/raw.tar.gz -C <results> raw
set -euo pipefail
first=${1:-0}
last=${2:-17}
clients=${CLIENTS:-20}
if ! [[ $clients =~ ^[1-9][0-9]*$ ]]; then
    echo "CLIENTS must be a positive integer, got '$clients'" >&2
    exit 2
fi
if [ "$clients" -eq 20 ]; then
    root=results/fashion_mnist_main
else
    root=results/fashion_mnist_c$clients
fi
raw=$root/raw
if [ ! -d "$raw" ] && [ -f "$root/raw.tar.gz" ]; then
    tar -xzf "$root/raw.tar.gz" -C "$root"     # resume from the committed runs
fi
mkdir -p "$raw"
protocol=(--dataset fashion_mnist --model fmnist_cnn --schedule linear --num-clients "$clients" --alpha 0.1 --rounds 30
          --final-window 10 --local-steps 10 --batch-size 32 --learning-rate 0.05 --momentum 0.9 --clip-norm 5.0
          --distribution d4 d5 d6 --workers 1)
engine() { OMP_NUM_THREADS=1 python -m simulations.engine "${protocol[@]}" "$@"; }
run() {  # name, then engine options
    local name=$1
    shift
    engine --out "$raw/$name" "$@" 2>&1 | tee -a "$raw/$name.log"
}
for ((seed = first; seed <= last; seed += 2)); do
    seeds=$(seq "$seed" $((seed + 1 > last ? last : seed + 1)))
    # shellcheck disable=SC2086
    run volume --bid-policy volume --budget-fraction 0.15 --num-selected 0 --selector flmarket rs dice qbs dds --seed $seeds
    # shellcheck disable=SC2086
    run equal --bid-policy constant --budget-fraction 0.7 --num-selected 0 --selector flmarket rs dice qbs dds --seed $seeds
    # shellcheck disable=SC2086
    run all --num-selected "$clients" --selector rs --seed $seeds
done
