"""PASS cost on one client: masking its counts against every peer's public key.

Run: ``.venv/bin/python -m benchmarks.bench_pass``.

Prints, for E participants and C classes, the wall time of one ``masked_counts`` call (E - 1
X25519 exchanges, HKDF and ChaCha20 expansions) and of the server's ``unmask_sum`` over E vectors.
"""

from __future__ import annotations

import time

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from flmarket_flwr.pass_protocol import PassParticipant, unmask_sum


def main() -> None:
    print(f"{'E':>5} {'C':>7} {'mask one client (s)':>20} {'unmask E vectors (s)':>21}")
    for num_clients in (10, 100, 500):
        for num_classes in (10, 10_000):
            keys = {i: X25519PrivateKey.generate().public_key().public_bytes_raw() for i in range(1, num_clients)}
            participant = PassParticipant(0, np.arange(num_classes), session=b"bench")
            keys[0] = participant.public_key
            start = time.perf_counter()
            masked = participant.masked_counts(keys)
            mask_time = time.perf_counter() - start
            vectors = np.tile(masked, (num_clients, 1))
            start = time.perf_counter()
            try:
                unmask_sum(vectors)
            except ValueError:
                pass  # copies of one vector are not a complete set; only the summing time matters here
            unmask_time = time.perf_counter() - start
            print(f"{num_clients:>5} {num_classes:>7} {mask_time:>20.4f} {unmask_time:>21.4f}", flush=True)


if __name__ == "__main__":
    main()
