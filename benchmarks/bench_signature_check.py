"""One Ed25519 signature check, the secure profile's commonest operation: libsodium's (PyNaCl, what
:func:`~flmarket_flwr.pass_protocol.directory.ed25519_verifies` runs) against OpenSSL's (``cryptography``, what the
profile ran before), side by side on the same keys and messages.

Run: ``.venv/bin/python -m benchmarks.bench_signature_check --runs 3`` (a few seconds).

Each run times both verifiers in alternation, ``--checks`` checks each over ``--keys`` keys (a fresh key object per
check for OpenSSL, as the profile built one from the directory's raw bytes each time), on a 200-byte message (an
advertisement or a bid signs about that much), and prints CPU microseconds a check and their ratio.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from flmarket_flwr.pass_protocol import generate_identity
from flmarket_flwr.pass_protocol.directory import ed25519_verifies

MESSAGE_BYTES = 200


def _openssl(key: bytes, signature: bytes, message: bytes) -> None:
    Ed25519PublicKey.from_public_bytes(key).verify(signature, message)


def _libsodium(key: bytes, signature: bytes, message: bytes) -> None:
    if not ed25519_verifies(key, signature, message):
        raise AssertionError("a valid signature did not verify")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--checks", type=int, default=3_000)
    parser.add_argument("--keys", type=int, default=100)
    args = parser.parse_args()
    triples = []
    for _ in range(args.keys):
        private, public = generate_identity()
        message = os.urandom(MESSAGE_BYTES)
        triples.append((public, private.sign(message), message))
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
          f"load average at start {os.getloadavg()[0]:.2f}")  # fmt: skip
    print("| run | OpenSSL, us a check | libsodium, us a check | OpenSSL / libsodium |")
    print("|---:|---:|---:|---:|")
    for run in range(1, args.runs + 1):
        timings = {}
        for name, check in (("openssl", _openssl), ("libsodium", _libsodium)):
            start = time.process_time()
            for position in range(args.checks):
                check(*triples[position % len(triples)])
            timings[name] = (time.process_time() - start) / args.checks * 1e6
        ratio = timings["openssl"] / timings["libsodium"]
        print(f"| {run} | {timings['openssl']:.1f} | {timings['libsodium']:.1f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
