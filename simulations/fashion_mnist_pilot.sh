#!/usr/bin/env bash
# The pilot for headroom (results/fashion_mnist_pilot/, simulations/PILOT.md): does training on all 20 clients
# beat a random k-subset by >= 5 points, paired by partition, where the Fashion-MNIST grid found no headroom?
# Resumable (finished jobs are skipped); one job at a time; logs in results/fashion_mnist_pilot/raw/*.log.
#   nice -n 15 bash simulations/fashion_mnist_pilot.sh
# Archive: tar -czf results/fashion_mnist_pilot/raw.tar.gz -C results/fashion_mnist_pilot raw
# Table:   python -m simulations.pilot results/fashion_mnist_pilot/raw --out results/fashion_mnist_pilot
# Protocol: Fashion-MNIST, fmnist_cnn, linear D1..D6 schedule, 20 clients, a FIXED round budget (30 rounds, no
# plateau stop), 10 local SGD steps per round (batch 32, lr 0.05, momentum 0.9, clip 5). RS at k = 20 is training
# on all clients (RS draws every client); RS at k = 5, 10 is one random k-subset per partition (seed).
# Phases in order of value (a stopped pilot still answers the most): Dirichlet 0.1 at d6 (k = 5, 10, 20); Dirichlet
# 0.2 at d6, seeds 0-4; Dirichlet 0.1 at d4 and d5 at k = 5 and 20 (the chosen cohort size); the rest of the seeds,
# k = 10 at d4-d5, 5 local steps at Dirichlet 0.1, d6; seeds 10-19 at d4-d6, k = 5 and 20.
set -euo pipefail
root=results/fashion_mnist_pilot
raw=$root/raw
if [ ! -d "$raw" ] && [ -f "$root/raw.tar.gz" ]; then
    tar -xzf "$root/raw.tar.gz" -C "$root"     # resume from the committed runs
fi
mkdir -p "$raw"
protocol=(--dataset fashion_mnist --model fmnist_cnn --schedule linear --num-clients 20 --rounds 30
          --final-window 10 --batch-size 32 --learning-rate 0.05 --momentum 0.9 --clip-norm 5.0 --workers 1
          --selector rs)
engine() { OMP_NUM_THREADS=1 python -m simulations.engine "${protocol[@]}" "$@"; }
run() {  # name, then engine options
    local name=$1
    shift
    engine --out "$raw/$name" "$@" 2>&1 | tee -a "$raw/$name.log"
}
all_seeds=(0 1 2 3 4 5 6 7 8 9)

run dir0.1_steps10 --alpha 0.1 --local-steps 10 --distribution d6 --num-selected 5 10 20 --seed "${all_seeds[@]}"
run dir0.2_steps10 --alpha 0.2 --local-steps 10 --distribution d6 --num-selected 5 10 20 --seed 0 1 2 3 4
run dir0.1_steps10 --alpha 0.1 --local-steps 10 --distribution d4 --num-selected 5 20 --seed "${all_seeds[@]}"
run dir0.1_steps10 --alpha 0.1 --local-steps 10 --distribution d5 --num-selected 5 20 --seed "${all_seeds[@]}"
run dir0.2_steps10 --alpha 0.2 --local-steps 10 --distribution d6 --num-selected 5 10 20 --seed "${all_seeds[@]}"
run dir0.1_steps10 --alpha 0.1 --local-steps 10 --distribution d4 d5 --num-selected 10 --seed "${all_seeds[@]}"
run dir0.1_steps5 --alpha 0.1 --local-steps 5 --distribution d6 --num-selected 5 10 20 --seed "${all_seeds[@]}"
# More partitions for the chosen setting's paired sd (the power calculation): seeds 10-19 at k = 5 and 20.
run dir0.1_steps10 --alpha 0.1 --local-steps 10 --distribution d4 d5 d6 --num-selected 5 20 --seed $(seq 10 19)
