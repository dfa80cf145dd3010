#!/usr/bin/env bash
# The Fashion-MNIST comparison (results/fashion_mnist/, issue 22): resumable, finished jobs are skipped, a
# stopped sweep loses at most the jobs in flight. Run from the repository root; logs go to
# results/fashion_mnist/raw/*.log; archive with `tar -czf results/fashion_mnist/raw.tar.gz -C results/fashion_mnist raw`.
#   bash simulations/fashion_mnist_sweep.sh [workers]
# Protocol: the real Fashion-MNIST (Debian's dataset-fashion-mnist), fmnist_cnn, the paper's linear D1..D6
# schedule, Dirichlet 0.5, 20 clients; FedAvg with 20 local steps per round until the plateau (as digits_xl).
# FLMarket runs the product's one selection rule at the least budget that buys the cohort, under both
# co-primary bid policies: volume (c N_e (1 + markup), one shared per-sample cost) and equal bids (the
# paper never states its bids). RS, QBS, DICE and DDS do not depend on the bids: run once.
# Phases in order of value, so a partial sweep still answers the most:
#   1. d4-d6, 10 of 20, seeds 0-4: the five selectors (volume bids) and FLMarket with equal bids;
#   2. FLMarket against S-FedAvg (raw/sfedavg), the protocol of simulations/digits_xl_sfedavg.sh: 5 of 20, d1-d6,
#      seeds 0-4, both sides with the same 10-per-class validation split taken out of the training pool; FLMarket
#      runs its real market phase (--market protocol), timed, S-FedAvg samples and values 5 clients every round;
#   3. d1-d6, 5/10/15 of 20, seeds 0-4 (the rest of the primary grid);
#   4. seeds 5-9 on d4-d6 at 10 of 20 (the headline gets 10 paired seeds).
set -euo pipefail
workers="${1:-2}"
root=results/fashion_mnist
raw=$root/raw
if [ ! -d "$raw" ] && [ -f "$root/raw.tar.gz" ]; then
    tar -xzf "$root/raw.tar.gz" -C "$root"     # resume from the committed runs
fi
mkdir -p "$raw"
protocol=(--dataset fashion_mnist --model fmnist_cnn --schedule linear --alpha 0.5 --num-clients 20
          --rounds 100 --min-rounds 30 --local-steps 20 --batch-size 32 --learning-rate 0.05 --momentum 0.9
          --clip-norm 5.0 --workers "$workers")
selectors=(flmarket rs qbs dice dds)
engine() { OMP_NUM_THREADS=1 python -m simulations.engine "${protocol[@]}" "$@"; }

phase() {  # distributions, cohort sizes, seeds
    local distributions=$1 sizes=$2 seeds=$3
    # shellcheck disable=SC2086
    engine --out "$raw/c20" --distribution $distributions --num-selected $sizes \
        --selector "${selectors[@]}" --seed $seeds 2>&1 | tee -a "$raw/c20.log"
    # shellcheck disable=SC2086
    engine --out "$raw/c20_equal" --bid-policy constant --distribution $distributions --num-selected $sizes \
        --selector flmarket --seed $seeds 2>&1 | tee -a "$raw/c20_equal.log"
}

phase "d4 d5 d6" "10" "0 1 2 3 4"
engine --out "$raw/sfedavg" --num-selected 5 --selector flmarket sfedavg --val-per-class 10 --market protocol \
    --distribution d1 d2 d3 d4 d5 d6 --seed 0 1 2 3 4 2>&1 | tee -a "$raw/sfedavg.log"
phase "d1 d2 d3 d4 d5 d6" "5 10 15" "0 1 2 3 4"
phase "d4 d5 d6" "10" "5 6 7 8 9"
