#!/usr/bin/env bash
# The budget-matched grid (results/fashion_mnist_budget/PREREG.md, issue 43): the main grid's setting (Fashion-MNIST,
# 20 clients, Dirichlet 0.1, d4-d6, 30 rounds, 10 local steps, R = f x total bid) on fresh seeds 30-39, FLMarket
# against RS, DICE, QBS and DDS each buying within the same R at the same bids, pay-as-bid (--baseline-match budget),
# under volume and equal bids.
# Resumable (the engine skips finished jobs; a committed raw.tar.gz is extracted first); one job at a time, one torch
# thread; logs in results/fashion_mnist_budget/raw/*.log.
#   nice -n 19 bash simulations/fashion_mnist_budget.sh          # seeds 30-39 (30 partitions)
#   nice -n 19 bash simulations/fashion_mnist_budget.sh 33 39    # resume from seed 33
# One seed at a time, every arm of both policies before the next, so a grid stopped anywhere holds whole partitions.
# Archive: tar -czf results/fashion_mnist_budget/raw.tar.gz -C results/fashion_mnist_budget raw
set -euo pipefail
first=${1:-30}
last=${2:-39}
root=results/fashion_mnist_budget
raw=$root/raw
if [ ! -d "$raw" ] && [ -f "$root/raw.tar.gz" ]; then
    tar -xzf "$root/raw.tar.gz" -C "$root"     # resume from the committed runs
fi
mkdir -p "$raw"
protocol=(--dataset fashion_mnist --model fmnist_cnn --schedule linear --num-clients 20 --alpha 0.1 --rounds 30
          --final-window 10 --local-steps 10 --batch-size 32 --learning-rate 0.05 --momentum 0.9 --clip-norm 5.0
          --torch-threads 1 --distribution d4 d5 d6 --num-selected 0 --baseline-match budget --workers 1)
engine() { OMP_NUM_THREADS=1 python -m simulations.engine "${protocol[@]}" "$@"; }
run() {  # name, then engine options
    local name=$1
    shift
    engine --out "$raw/$name" "$@" 2>&1 | tee -a "$raw/$name.log"
}
for ((seed = first; seed <= last; seed++)); do
    run volume --bid-policy volume --budget-fraction 0.15 --selector flmarket rs dice qbs dds --seed "$seed"
    run equal --bid-policy constant --budget-fraction 0.7 --selector flmarket rs dice qbs dds --seed "$seed"
done
