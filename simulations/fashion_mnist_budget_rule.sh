#!/usr/bin/env bash
# The budget-rule grid (results/fashion_mnist_budget_rule/PREREG.md, issue 49): the equal-money grid's setting
# (Fashion-MNIST, 20 clients, Dirichlet 0.1, d4-d6, 30 rounds, 10 local steps, R = f x total bid) on fresh seeds
# 200-209: FLMarket with the whole-budget rule and with the paper's rule, against RS and DICE each buying within the
# same R at the same bids, pay-as-bid (--baseline-match budget), under volume and equal bids.
# Resumable (the engine skips finished jobs; a committed raw.tar.gz is extracted first); one job at a time (GRID_WORKERS=2:
# two at once), one torch thread each; logs in results/fashion_mnist_budget_rule/raw/*.log. The paper's rule and the
# baselines go to raw/<policy>, the whole-budget rule to raw/<policy>-whole (the report reads both).
#   nice -n 19 bash simulations/fashion_mnist_budget_rule.sh            # seeds 200-209 (30 partitions)
#   nice -n 19 bash simulations/fashion_mnist_budget_rule.sh 203 209    # resume from seed 203
# One seed at a time, every arm of both policies before the next, so a grid stopped anywhere holds whole partitions.
# Archive: tar -czf results/fashion_mnist_budget_rule/raw.tar.gz -C results/fashion_mnist_budget_rule raw
set -euo pipefail
first=${1:-200}
last=${2:-209}
root=results/fashion_mnist_budget_rule
raw=$root/raw
if [ ! -d "$raw" ] && [ -f "$root/raw.tar.gz" ]; then
    tar -xzf "$root/raw.tar.gz" -C "$root"     # resume from the committed runs
fi
mkdir -p "$raw"
protocol=(--dataset fashion_mnist --model fmnist_cnn --schedule linear --num-clients 20 --alpha 0.1 --rounds 30
          --final-window 10 --local-steps 10 --batch-size 32 --learning-rate 0.05 --momentum 0.9 --clip-norm 5.0
          --torch-threads 1 --distribution d4 d5 d6 --num-selected 0 --baseline-match budget
          --workers "${GRID_WORKERS:-1}")
engine() { OMP_NUM_THREADS=1 python -m simulations.engine "${protocol[@]}" "$@"; }
run() {  # name, then engine options
    local name=$1
    shift
    engine --out "$raw/$name" "$@" 2>&1 | tee -a "$raw/$name.log"
}
volume=(--bid-policy volume --budget-fraction 0.15)
equal=(--bid-policy constant --budget-fraction 0.7)
for ((seed = first; seed <= last; seed++)); do
    run volume-whole "${volume[@]}" --auction-budget-rule whole --selector flmarket --seed "$seed"
    run volume "${volume[@]}" --selector flmarket rs dice --seed "$seed"
    run equal-whole "${equal[@]}" --auction-budget-rule whole --selector flmarket --seed "$seed"
    run equal "${equal[@]}" --selector flmarket rs dice --seed "$seed"
done
