"""The PASS client's state per round: what each round keeps, its one record form, ``close()``, and the encodings'
bytes pinned."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from flwr.app import ConfigRecord
from hypothesis import given, settings
from hypothesis import strategies as st

from flmarket_flwr.pass_protocol import PassClient, PassError, PassServer
from flmarket_flwr.pass_protocol.client import Stage
from flmarket_flwr.pass_protocol.client_state import (
    ROUND_OF_STAGE,
    Advertised,
    ClientRound,
    Closed,
    Masked,
    Shared,
    Unmasked,
    read_state,
)
from flmarket_flwr.pass_protocol.encoding import (
    counts_commitment,
    indices_to_bitmap,
    roster_fingerprint,
    share_digest,
    survivor_transcript,
)

SESSION = b"session-1"
SECRETS = (
    "cipher_private_key",
    "mask_private_key",
    "self_seed",
    "pair_seeds",
    "channel_secrets",
    "held_shares",
    "counts",
)


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


def _masked(count: int = 4) -> tuple[PassServer, dict[int, PassClient], dict]:
    server, clients, requests = _advertised(count)
    replies = {i: clients[i].share_keys(r).to_record() for i, r in requests.items()}
    masked = {i: clients[i].mask_input(r).to_record() for i, r in server.receive_shares(replies).items()}
    return server, clients, server.receive_masked(masked)


def _held(client: PassClient) -> set[str]:
    """The secrets in the client's record."""
    return set(SECRETS) & set(client.to_record())


def test_each_round_keeps_only_what_a_later_round_reads_and_reads_back_from_its_record() -> None:
    server, clients, requests = _advertised()
    expected = {
        Advertised: {"cipher_private_key", "mask_private_key", "counts"},
        Shared: {"cipher_private_key", "self_seed", "pair_seeds", "channel_secrets", "counts"},
        Masked: {"held_shares"},
        Unmasked: set(),
    }

    def check(kind: type[ClientRound]) -> None:
        for client in clients.values():
            assert type(client.round) is kind and client.stage == kind.stage
            assert _held(client) == expected[kind]
            record = client.to_record()
            assert read_state(record) == client.round
            assert PassClient.from_record(record).to_record() == record
            ConfigRecord(record)  # every value is one a ConfigRecord holds

    check(Advertised)
    replies = {i: clients[i].share_keys(r).to_record() for i, r in requests.items()}
    check(Shared)
    masked = {i: clients[i].mask_input(r).to_record() for i, r in server.receive_shares(replies).items()}
    check(Masked)
    unmask = {i: clients[i].unmask(r).to_record() for i, r in server.receive_masked(masked).items()}
    check(Unmasked)
    server.receive_unmask(unmask)
    assert server.finish().tolist() == [4, 8, 12]
    for client in clients.values():
        assert client.transcript == server.transcript and client.survivor_count == 4
        assert client.state.transcript == server.transcript and client.state.count_bound == 100
        assert client.counts_nonce is not None and client.unmask_requested
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
    with pytest.raises(PassError, match="at stage UNMASKED has no key 'held_shares'"):
        PassClient.from_record({"stage": 4, "held_shares": [b"x"]})  # wiped at unmask: not read back either


_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "bytes": st.binary(max_size=40),
    "int": st.integers(min_value=0, max_value=2**63 - 1),
    "bool": st.booleans(),
    "tuple[int, ...]": st.lists(st.integers(min_value=0, max_value=2**63 - 1), max_size=5).map(tuple),
    "tuple[bytes, ...]": st.lists(st.binary(max_size=40), max_size=5).map(tuple),
}


def _states(kind: type[ClientRound]) -> st.SearchStrategy[ClientRound]:
    return st.builds(kind, **{item.name: _VALUES[str(item.type)] for item in dataclasses.fields(kind)})


@pytest.mark.parametrize("stage", sorted(ROUND_OF_STAGE), ids=lambda stage: stage.name)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_every_rounds_state_reads_back_from_its_record(stage: Stage, data: st.DataObject) -> None:
    state = data.draw(_states(ROUND_OF_STAGE[stage]))
    record = state.to_record()
    assert record["stage"] == int(stage) and read_state(record) == state
    ConfigRecord(record)
    assert read_state(dict(ConfigRecord(record))) == state  # as a node's context keeps it between messages


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
    assert _held(client)
    client.close()
    assert client.to_record() == {"stage": int(Stage.CLOSED), "session": SESSION}
    assert client.counts_nonce is None and client.round == Closed(session=SESSION, unmask_requested=False)
    with pytest.raises(PassError, match="not allowed now"):
        getattr(client, step)(requests[1])
    another = PassServer(b"session-2", 3, count_bound=100).advertise_requests([101, 102, 103])[1]
    with pytest.raises(PassError, match="already advertised"):
        client.advertise(another, [1, 2, 3])
    client.close()  # closed stays closed
    assert PassClient.from_record(client.to_record()).round == client.round


def test_close_keeps_an_unmask_request_so_no_later_session_is_joined() -> None:
    _, clients, unmask_requests = _masked()
    client = clients[1]
    client.unmask(unmask_requests[1])
    client.close()
    assert client.unmask_requested
    assert client.to_record() == {"stage": int(Stage.CLOSED), "session": SESSION, "unmask_requested": True}
    assert not _held(client)


def test_each_step_runs_only_from_the_stage_before_it() -> None:
    _, clients, _ = _advertised()
    client = clients[1]
    with pytest.raises(PassError, match=r"mask_input is not allowed now \(protocol stage 1, need 2\)"):
        client.mask_input({"senders": [], "ciphertexts": [], "share_digests": [], "signatures": []})
    with pytest.raises(PassError, match="unmask is not allowed now"):
        client.unmask({"survivors": b"", "dropped": b"", "signers": [], "signatures": []})
    with pytest.raises(PassError, match="already advertised"):
        client.advertise(PassServer(b"session-2", 3, count_bound=100).advertise_requests([101, 102, 103])[1], [1, 2, 3])
    assert type(client.round) is Advertised  # a refused step leaves the state as it was


def test_a_refused_unmask_request_is_the_one_unmask_request() -> None:
    """An unmask request is answered once: one refused (a view this client cannot answer) counts, and is kept."""
    _, clients, requests = _masked()
    client = clients[1]
    with pytest.raises(PassError, match="survivors"):
        client.unmask({"survivors": b"\x01", "dropped": b"", "signers": [], "signatures": []})  # one survivor: refused
    assert client.unmask_requested and type(client.round) is Masked
    restored = PassClient.from_record(client.to_record())
    for again in (client, restored):
        with pytest.raises(PassError, match="already received an unmask request"):
            again.unmask(requests[1])
        with pytest.raises(PassError, match="already signed a survivor set"):
            again.sign_survivors(requests[1].to_record(), None)
