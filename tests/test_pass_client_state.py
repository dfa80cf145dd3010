"""The PASS client's typed state, its one record form, ``close()``, and the encodings' bytes pinned."""

from __future__ import annotations

import numpy as np
import pytest

from flmarket_flwr.pass_protocol import PassClient, PassError, PassServer
from flmarket_flwr.pass_protocol.client import ClientState, Stage
from flmarket_flwr.pass_protocol.encoding import (
    counts_commitment,
    indices_to_bitmap,
    roster_fingerprint,
    share_digest,
    survivor_transcript,
)

SESSION = b"session-1"
SECRETS = ("cipher_private_key", "mask_private_key", "self_seed", "pair_seeds", "channel_secrets", "held_shares")


def test_the_encodings_keep_their_bytes() -> None:
    """What messages carry and signatures bind, pinned to the bytes PASS v2 has always produced."""
    assert counts_commitment(SESSION, 3, [1, 2, 3], b"n" * 32).hex() == (
        "2d6eb291151f77e5f9000f8f4c1a04c063f23d30bdb8293e16e97b88ae855c5e"
    )
    assert share_digest(SESSION, 2, 5, b"b", b"\x07" * 32).hex() == (
        "5117688d17b10b824a114db971885e1ffc88f7abd99ab85242a8df5b720a478d"
    )
    assert share_digest(SESSION, 2, 5, b"s", b"\x07" + b"\x00" * 31).hex() == (
        "b862409fb5c4c4123df2abf7462b88f041ad36dd6864ce872fd5472be363c5b1"
    )
    assert survivor_transcript(SESSION, [1, 4, 2]).hex() == (
        "c080e1437a79f34748df0f75ad4b804b4d38b438b7767b758583bee06fb512b0"
    )
    assert roster_fingerprint(7, SESSION, [101, 102, 103]).hex() == (
        "ed4b2fa79d21b1664b8bcc06979322c82d044b3edcce457a61998047395bc483"
    )
    assert indices_to_bitmap([1, 3, 9]) == b"\x05\x01"


def _advertised(count: int = 4) -> tuple[PassServer, dict[int, PassClient], dict]:
    server = PassServer(SESSION, 3, count_bound=100)
    clients = {i: PassClient() for i in range(1, count + 1)}
    requests = server.advertise_requests([100 + i for i in clients])
    adverts = {i: clients[i].advertise(r, [1, 2, 3]).to_record() for i, r in requests.items()}
    return server, clients, server.receive_advertisements(adverts)


def test_the_state_reads_back_from_its_record_at_every_stage() -> None:
    server, clients, requests = _advertised()
    stages = [Stage.ADVERTISED]
    replies = {i: clients[i].share_keys(r).to_record() for i, r in requests.items()}
    stages.append(Stage.SHARED)
    masked = {i: clients[i].mask_input(r).to_record() for i, r in server.receive_shares(replies).items()}
    stages.append(Stage.MASKED)
    for client in clients.values():
        record = client.to_record()
        assert ClientState.from_record(record) == client.state
        assert PassClient.from_record(record).to_record() == record
    unmask = {i: clients[i].unmask(r).to_record() for i, r in server.receive_masked(masked).items()}
    server.receive_unmask(unmask)
    assert server.finish().tolist() == [4, 8, 12]
    for client in clients.values():
        assert client.state.stage == Stage.UNMASKED and client.state.held_shares == []
        assert ClientState.from_record(client.to_record()) == client.state
        assert client.transcript == server.transcript and client.survivor_count == 4
    assert PassClient().to_record() == {"stage": 0}


def test_a_record_with_an_unknown_or_mistyped_key_is_refused_by_name() -> None:
    with pytest.raises(PassError, match="no key 'sesion'"):
        PassClient.from_record({"stage": 0, "sesion": SESSION})
    with pytest.raises(PassError, match="'index' must be int"):
        PassClient.from_record({"stage": 1, "index": b"1"})
    with pytest.raises(PassError, match="'neighbours' must be list\\[int\\]"):
        PassClient.from_record({"stage": 2, "neighbours": [1, True]})
    with pytest.raises(PassError, match="stage 7 is not a stage"):
        PassClient.from_record({"stage": 7})


@pytest.mark.parametrize("after", ["advertise", "share_keys", "mask_input"])
def test_close_wipes_every_secret_and_no_step_runs_after_it(after: str) -> None:
    server, clients, requests = _advertised()
    step = "share_keys"
    if after != "advertise":
        replies = {i: clients[i].share_keys(r).to_record() for i, r in requests.items()}
        requests, step = server.receive_shares(replies), "mask_input"
    if after == "mask_input":
        masked = {i: clients[i].mask_input(r).to_record() for i, r in requests.items()}
        requests, step = server.receive_masked(masked), "unmask"
    client = clients[1]
    assert any(name in client.to_record() for name in SECRETS)
    client.close()
    assert client.to_record() == {"stage": int(Stage.CLOSED), "session": SESSION}
    assert client.counts_nonce is None and client.state.counts == b""
    with pytest.raises(PassError, match="not allowed now"):
        getattr(client, step)(requests[1])
    another = PassServer(b"session-2", 3, count_bound=100).advertise_requests([101, 102, 103])[1]
    with pytest.raises(PassError, match="already advertised"):
        client.advertise(another, [1, 2, 3])


def test_close_keeps_an_unmask_request_so_no_later_session_is_joined() -> None:
    server, clients, requests = _advertised()
    replies = {i: clients[i].share_keys(r).to_record() for i, r in requests.items()}
    masked = {i: clients[i].mask_input(r).to_record() for i, r in server.receive_shares(replies).items()}
    unmask_requests = server.receive_masked(masked)
    client = clients[1]
    client.unmask(unmask_requests[1])
    client.close()
    assert client.unmask_requested
    assert client.to_record() == {"stage": int(Stage.CLOSED), "session": SESSION, "unmask_requested": True}
    assert not np.any([name in client.to_record() for name in SECRETS])
