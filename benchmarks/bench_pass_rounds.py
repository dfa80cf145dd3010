"""One PASS v2 client's rounds repeated from one state, for instruction counts (``valgrind --tool=callgrind``).

Run: ``valgrind --tool=callgrind --callgrind-out-file=/dev/null .venv/bin/python -m benchmarks.bench_pass_rounds
--repeat 10`` and again with ``--repeat 0``; the difference of the two "Collected" counts over 10 is one
client's share keys, masked input and unmask (its advertisement left out). A session of ``--clients`` clients
is set up with the degree set to ``--degree`` (E = 100 and k = 32 by default: the k of E = 1,000 at a
hundredth of the set-up), its server builds the share-keys requests, the middle client's neighbours share
their keys, and the middle client then runs its three rounds ``--repeat`` times, each time from its state
after advertising, for the view "everyone survived". Instruction counts do not depend on the machine's load,
unlike CPU time on a shared machine. No directory (no signatures), as ``bench_pass_client``.
"""

from __future__ import annotations

import argparse

import numpy as np

from flmarket_flwr.pass_protocol import PassClient, PassServer
from flmarket_flwr.pass_protocol.messages import MaskRequest, UnmaskRequest


def run(num_clients: int, degree: int, repeat: int) -> None:
    """Set up the session, then run the middle client's three rounds ``repeat`` times."""
    rng = np.random.default_rng(0)
    server = PassServer(b"bench-rounds", 10, 1000, degree=degree)
    states, adverts = {}, {}
    for index, request in server.advertise_requests(list(range(num_clients))).items():
        client = PassClient()
        adverts[index] = client.advertise(request.to_record(), rng.integers(0, 1000, 10)).to_record()
        states[index] = client.to_record()
    share_requests = server.receive_advertisements(adverts)
    measured = num_clients // 2
    inbox = MaskRequest([], [], [])
    for v in sorted(server.graph[measured]):
        reply = PassClient.from_record(states[v]).share_keys(share_requests[v].to_record())
        position = reply.receivers.index(measured)
        inbox.senders.append(v)
        inbox.ciphertexts.append(reply.ciphertexts[position])
        inbox.share_digests.append(reply.share_digests[position])
    everyone = UnmaskRequest.of(sorted(server.graph), []).to_record()
    share_request, mask_request = share_requests[measured].to_record(), inbox.to_record()
    for _ in range(repeat):
        client = PassClient.from_record(dict(states[measured]))
        client.share_keys(share_request)
        client.mask_input(mask_request)
        client.unmask(everyone)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=100, help="number of clients E in the session")
    parser.add_argument("--degree", type=int, default=32, help="graph degree k")
    parser.add_argument("--repeat", type=int, default=10, help="repetitions of the measured client's rounds")
    args = parser.parse_args()
    run(args.clients, args.degree, args.repeat)


if __name__ == "__main__":
    main()
