"""One client cannot stop PASS for everyone (issue 29, item 4): each attack is played by one real client whose
replies are altered on the way to the server, at E = 8 and E = 40; the market finishes for the others with the
culprit named in ``MarketOutcome.excluded``. Each attack runs in both profiles at their defaults: the default one
(no identity keys, the protocol's own threshold, a sparse graph at E = 40, exact counts) and the secure one
(drop-in nodes configured by ``market-security=malicious`` alone: identity keys, the pinned directory, the
complete graph, split tolerance 2 and its higher thresholds, the roster floor, noise and ledger; a buyer in the
profile). Colluders taking turns across re-runs: ``tests/test_colluders_taking_turns.py``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from adversary import (
    NUM_CLASSES,
    altering,
    client_secrets,
    honest_grid,
    make_counts,
    market_config,
    run_pass_rounds,
    send,
    signed_setup,
)
from test_secure_profile_market import drop_in_app, profile_setup, secure_config

from flmarket_flwr.market import MarketError, MarketPhase
from flmarket_flwr.market.wire.messages import RECORD_KEY
from flmarket_flwr.pass_protocol import PassClient, PassServer
from flmarket_flwr.pass_protocol import client as client_module
from flmarket_flwr.pass_protocol.dleq import share_point
from flmarket_flwr.pass_protocol.graph import neighbourhood_size, secret_threshold, share_threshold
from flmarket_flwr.pass_protocol.messages import UnmaskRequest
from flmarket_flwr.pass_protocol.shamir import random_scalar, scalar_to_bytes
from simulations.inprocess_grid import InProcessGrid

SIZES = [8, 40]
PROFILES = ["default", "secure"]


@pytest.fixture(autouse=True)
def ledger_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "flmarket-home"
    monkeypatch.setenv("FLMARKET_HOME", str(home))
    return home


def _market(profile: str, counts, tmp_path: Path, reply_hook=None):
    """The grid of the real handlers and the buyer's config in ``profile``, both at its defaults: ``default`` (the
    library's handlers, a cost-based bid) or ``secure`` (drop-in nodes whose node config is the profile's alone)."""
    if profile == "default":
        return honest_grid(counts, reply_hook=reply_hook), market_config()
    nodes = sorted(counts)
    configs, directory = profile_setup(tmp_path, nodes)
    return InProcessGrid(drop_in_app(counts), nodes, node_configs=configs, reply_hook=reply_hook), secure_config(
        directory
    )


def _check_sum_over(outcome, counts, nodes, config) -> None:
    """``N_s`` is the sum over ``nodes``: exactly without noise; with it, within the noise's tail and far closer to
    it than to the sum with the excluded clients' counts in."""
    exact = np.array(_exact_over(counts, nodes))
    if config.noise is None:
        assert outcome.global_counts == exact.tolist()
        return
    noisy, everyone = np.array(outcome.global_counts), np.array(_exact_over(counts, counts))
    assert np.abs(noisy - exact).max() <= config.noise_tolerance
    assert np.abs(noisy - exact).sum() < np.abs(noisy - everyone).sum() / 4


def _garbled(ciphertext: bytes) -> bytes:
    """Well-formed garbage: the real ciphertext with its 16-byte authentication tag zeroed."""
    return ciphertext[:-16] + bytes(16)


def _exact_over(counts, nodes) -> list[int]:
    return [int(c) for c in np.sum([counts[n] for n in nodes], axis=0)]


# --- (a) a dealer announces threshold k and garbles one share ----------------------------------------------
def _threshold_k_and_one_garbled(record) -> None:
    record["threshold"] = len(record["receivers"])
    record["ciphertexts"] = [_garbled(c) if i == 0 else c for i, c in enumerate(record["ciphertexts"])]


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("num_nodes", SIZES)
def test_a_dealer_announcing_threshold_k_is_refused_at_its_shares_and_the_market_finishes(
    tmp_path: Path, num_nodes: int, profile: str
) -> None:
    """With ``t = k`` one accusing receiver would leave the dealer's mask key ``k - 1`` holders: the server refuses
    any threshold above ``k - 1`` where it is announced, names the dealer, and PASS goes on without it."""
    counts = make_counts(num_nodes, seed=29)
    attacker = sorted(counts)[3]
    hook = altering(attacker, "market_share", _threshold_k_and_one_garbled)
    grid, config = _market(profile, counts, tmp_path, hook)
    outcome = MarketPhase(config).run(grid)
    assert set(outcome.excluded) == {attacker}
    assert "announced threshold" in outcome.excluded[attacker]
    honest = [n for n in counts if n != attacker]
    assert outcome.pass_participants == sorted(honest) and len(outcome.pass_sessions) == 1
    _check_sum_over(outcome, counts, honest, config)


# --- (c) garbage to more than k - t receivers: the session fails closed, the market runs it again -------------
def _garbage_to_first(how_many: int):
    def change(record) -> None:
        record["ciphertexts"] = [_garbled(c) if i < how_many else c for i, c in enumerate(record["ciphertexts"])]

    return change


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("num_nodes", SIZES)
def test_garbage_to_more_than_k_minus_t_receivers_is_named_and_pass_runs_again_without_it(
    tmp_path: Path, num_nodes: int, profile: str
) -> None:
    """``k - t + 1`` receivers accuse the sender (``t`` the threshold it announced itself: the profile's split
    tolerance raises it): its mask key keeps ``t - 1`` holders, the session stops before any unmask request, and a
    fresh session without the named sender releases the others' sum (exact, or noisy in the profile)."""
    counts = make_counts(num_nodes, seed=31)
    k = num_nodes - 1 if num_nodes <= 20 or profile == "secure" else neighbourhood_size(num_nodes)
    attacker = sorted(counts)[5]
    announced = []

    def change(record) -> None:
        assert len(record["receivers"]) == k
        announced.append(record["threshold"])
        _garbage_to_first(k - record["threshold"] + 1)(record)

    grid, config = _market(profile, counts, tmp_path, altering(attacker, "market_share", change))
    outcome = MarketPhase(config).run(grid)
    assert announced[0] == (share_threshold(k) if profile == "default" else secret_threshold(k, 2))
    assert set(outcome.excluded) == {attacker}
    assert "garbage shares" in outcome.excluded[attacker]
    first, second = outcome.pass_sessions
    assert first.named == [attacker] and "cannot be rebuilt" in first.result
    assert second.result == "released" and second.roster == sorted(n for n in counts if n != attacker)
    honest = [n for n in counts if n != attacker]
    assert outcome.pass_participants == sorted(honest)
    assert sum(m.metadata.message_type == "query.market_unmask" for m in grid.sent) == len(honest)  # session 2's
    _check_sum_over(outcome, counts, honest, config)


# --- a second session of one run: joined only by a client that released nothing -----------------------------
def _advertise(grid, server: PassServer) -> dict[int, object]:
    requests = server.advertise_requests(sorted(grid_nodes(grid)))
    return send(grid, "market_advertise", {server.node_of[i]: r.to_record() for i, r in requests.items()})


def _session_secrets(grid, node: int) -> set[bytes]:
    """A node's secrets of the current session: keys, seeds, held shares, nonce (its counts are not one)."""
    secrets = client_secrets(grid, node)
    secrets.pop("pass/counts", None)
    return {value if isinstance(value, bytes) else b"".join(value) for value in secrets.values()}


def grid_nodes(grid) -> list[int]:
    return sorted(grid.get_node_ids())


@pytest.mark.parametrize("upto", [1, 2, 3])
def test_a_client_that_never_unmasked_joins_a_fresh_session_and_forgets_the_earlier_one(upto: int) -> None:
    """A server stops a session after advertise, share keys or masked input and starts another: every client
    joins it with fresh keys, its earlier secrets (keys, seeds, others' shares) are gone, and a session once left
    is refused."""
    counts = make_counts(8, seed=41)
    grid = honest_grid(counts)
    first = PassServer(b"session-1", NUM_CLASSES, 10**9, run_id=grid.run.run_id)
    run_pass_rounds(grid, sorted(counts), first, upto=upto)
    before = {node: _session_secrets(grid, node) for node in counts}
    second = PassServer(b"session-2", NUM_CLASSES, 10**9, run_id=grid.run.run_id)
    replies = _advertise(grid, second)
    assert all(not reply.has_error() for reply in replies.values())
    for node in counts:
        after = _session_secrets(grid, node)
        assert after and not before[node] & after  # nothing of session 1 is kept
        state = grid.context(node).state.config_records[RECORD_KEY]
        assert state["pass/session"] == b"session-2" and list(state["pass-earlier-sessions"]) == [b"session-1"]
    again = PassServer(b"session-1", NUM_CLASSES, 10**9, run_id=grid.run.run_id)
    assert all(reply.has_error() for reply in _advertise(grid, again).values())  # wipes session 2 as well
    third = PassServer(b"session-3", NUM_CLASSES, 10**9, run_id=grid.run.run_id)
    assert all(not reply.has_error() for reply in _advertise(grid, third).values())


def test_a_client_asked_to_unmask_refuses_any_later_session_of_the_run() -> None:
    """The two-sums attack: a server that had a sum released (or asked for one) starts a second session to
    difference the two. Every client that was asked to unmask refuses, and wipes what it still held."""
    counts = make_counts(8, seed=43)
    grid = honest_grid(counts)
    first = PassServer(b"session-1", NUM_CLASSES, 10**9, run_id=grid.run.run_id)
    run_pass_rounds(grid, sorted(counts), first, upto=4)
    assert first.finish() is not None  # the first sum was released
    replies = _advertise(grid, PassServer(b"session-2", NUM_CLASSES, 10**9, run_id=grid.run.run_id))
    assert all(reply.has_error() for reply in replies.values())
    for node in counts:
        assert client_secrets(grid, node) == {}
        assert grid.context(node).state.config_records[RECORD_KEY]["pass/session"] == b"session-1"


def test_in_the_profile_a_buyer_running_pass_again_after_a_release_gets_no_second_session(tmp_path: Path) -> None:
    """The two-sums attack by the buyer's own machinery, against drop-in nodes in the secure profile: after one
    session released ``N_s``, a second session of the same run is refused by every node at advertise, before any
    key, share or masked input; each node's ledger holds the one release and its one spend."""
    counts = make_counts(8, seed=43)
    grid, config = _market("secure", counts, tmp_path)
    phase = MarketPhase(config)
    released = phase.run_pass(grid, sorted(counts))
    assert released.participants == sorted(counts)
    with pytest.raises(MarketError, match="no re-run: 0 client"):
        phase.run_pass(grid, sorted(counts))
    second = phase.pass_sessions[-1]
    assert second.named == sorted(counts)
    assert all(reason.startswith("market_advertise") for reason in phase._excluded.values())
    assert sum(m.metadata.message_type == "query.market_mask" for m in grid.sent) == len(counts)  # session 1 only
    ledgers = [json.loads(path.read_text()) for path in (tmp_path / "flmarket-home").glob("ledger/*/*.json")]
    assert len(ledgers) == len(counts)
    assert all(len(ledger["records"]) == len(ledger["spent"]) == 1 for ledger in ledgers)


def test_a_client_refused_at_unmask_still_refuses_a_later_session() -> None:
    """Asked to unmask with a set it cannot answer, a client refuses and sends no share; it still never joins
    another session of the run: its neighbours may have answered the same request."""
    counts = make_counts(8, seed=47)
    grid = honest_grid(counts)
    first = PassServer(b"session-1", NUM_CLASSES, 10**9, run_id=grid.run.run_id)
    requests = run_pass_rounds(grid, sorted(counts), first, upto=3)
    victim_index = min(requests)
    bogus = UnmaskRequest.of([victim_index], [])  # one survivor: every client refuses it
    replies = send(grid, "market_unmask", {first.node_of[victim_index]: bogus.to_record()})
    assert all(reply.has_error() for reply in replies.values())
    replies = _advertise(grid, PassServer(b"session-2", NUM_CLASSES, 10**9, run_id=grid.run.run_id))
    victim = first.node_of[victim_index]
    assert replies[victim].has_error()
    assert all(not reply.has_error() for node, reply in replies.items() if node != victim)


# --- (b) a dealer shares a random value instead of its mask key, then withholds its masked input -------------
def _dealing_a_random_value(monkeypatch, node: int) -> None:
    """Make ``node``'s real client deal shares of a random scalar instead of its mask key. Each share comes with
    its true point, so every receiver's check passes: only the dealing as a whole is wrong."""
    honest_share_keys, honest_scalar = PassClient.share_keys, client_module.mask_scalar

    def share_keys(self, request, directory=None, identity_key=None):
        if self.state.node_id != node:
            return honest_share_keys(self, request, directory, identity_key)
        monkeypatch.setattr(client_module, "mask_scalar", lambda private_key: scalar_to_bytes(random_scalar()))
        try:
            return honest_share_keys(self, request, directory, identity_key)
        finally:
            monkeypatch.setattr(client_module, "mask_scalar", honest_scalar)

    monkeypatch.setattr(PassClient, "share_keys", share_keys)


def _withholding(node: int, action: str):
    """A reply hook that drops ``node``'s reply to ``query.<action>`` (the server sees a timeout)."""

    def hook(instruction, reply):
        if instruction.metadata.dst_node_id == node and instruction.metadata.message_type == f"query.{action}":
            return None
        return reply

    return hook


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("num_nodes", SIZES)
def test_a_dealer_of_a_random_value_that_withholds_its_input_is_named_before_anyone_unmasks(
    monkeypatch, tmp_path: Path, num_nodes: int, profile: str
) -> None:
    """Its neighbours cannot tell its shares from true ones, and its masks sit in their inputs. Before any unmask
    request the server checks the points of its surviving holders against its advertised mask key, names it
    ("mis-dealt"), and runs a fresh session without it: nobody unmasked for the first session."""
    counts = make_counts(num_nodes, seed=37)
    attacker = sorted(counts)[4]
    _dealing_a_random_value(monkeypatch, attacker)
    grid, config = _market(profile, counts, tmp_path, _withholding(attacker, "market_mask"))
    outcome = MarketPhase(config).run(grid)
    assert set(outcome.excluded) == {attacker}
    assert "mis-dealt shares" in outcome.excluded[attacker]
    first, second = outcome.pass_sessions
    assert first.named == [attacker] and "do not rebuild its advertised mask key" in first.result
    unmasks = [m for m in grid.sent if m.metadata.message_type == "query.market_unmask"]
    assert len(unmasks) == num_nodes - 1, "only the second session's unmask round"
    honest = [n for n in counts if n != attacker]
    assert second.roster == sorted(honest) and outcome.pass_participants == sorted(honest)
    _check_sum_over(outcome, counts, honest, config)


def _garbling_in_session(node: int, session: int, how_many: int):
    """A reply hook by which ``node`` garbles its first ``how_many`` share ciphertexts in its ``session``-th share
    round only (a client that waits for the re-run to strike)."""
    seen = {"rounds": 0}

    def hook(instruction, reply):
        if instruction.metadata.dst_node_id == node and instruction.metadata.message_type == "query.market_share":
            seen["rounds"] += 1
            if seen["rounds"] == session and not reply.has_error():
                _garbage_to_first(how_many)(reply.content.config_records[RECORD_KEY])
        return reply

    return hook


def _chained(*hooks):
    def hook(instruction, reply):
        for each in hooks:
            reply = each(instruction, reply)
            if reply is None:
                return None
        return reply

    return hook


@pytest.mark.parametrize("reruns", [1, 2])
def test_the_re_runs_are_bounded_by_pass_reruns(reruns: int) -> None:
    """Two clients that stop a session in turn: the second strikes in the re-run. With one re-run allowed the
    market stops with the second session's error; with two, a third session without both releases the sum."""
    counts = make_counts(8, seed=53)
    first, second = sorted(counts)[1], sorted(counts)[6]
    hooks = _chained(_garbling_in_session(first, 1, 4), _garbling_in_session(second, 2, 4))  # k = 7, t = 4
    phase = MarketPhase(market_config(pass_reruns=reruns))
    if reruns == 1:
        with pytest.raises(MarketError, match="cannot be rebuilt"):
            phase.run(honest_grid(counts, reply_hook=hooks))
        assert [session.named for session in phase.pass_sessions] == [[first], [second]]
        return
    outcome = phase.run(honest_grid(counts, reply_hook=hooks))
    assert [session.named for session in outcome.pass_sessions] == [[first], [second], []]
    honest = [n for n in counts if n not in (first, second)]
    assert outcome.global_counts == _exact_over(counts, honest)


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("num_nodes", SIZES)
def test_a_share_that_does_not_match_its_point_names_its_dealer_and_pass_finishes(
    tmp_path: Path, num_nodes: int, profile: str
) -> None:
    """A dealer sends one receiver a share whose point (in the digest) is another's: the receiver's check fails,
    it accuses with the proven channel secret, the server's own check of the opened share convicts the dealer."""
    counts = make_counts(num_nodes, seed=59)
    attacker = sorted(counts)[2]

    def wrong_point(record) -> None:
        digests = list(record["share_digests"])
        digests[0] = share_point(scalar_to_bytes(random_scalar())) + digests[0][32:]
        record["share_digests"] = digests

    grid, config = _market(profile, counts, tmp_path, altering(attacker, "market_share", wrong_point))
    outcome = MarketPhase(config).run(grid)
    assert set(outcome.excluded) == {attacker} and "garbage shares" in outcome.excluded[attacker]
    assert len(outcome.pass_sessions) == 1
    honest = [n for n in counts if n != attacker]
    assert outcome.pass_participants == sorted(honest)
    _check_sum_over(outcome, counts, honest, config)


def test_with_identity_keys_the_re_run_is_signed_and_checked_like_the_first_session() -> None:
    """The secure set-up: the fresh session has its own roster fingerprint, signatures and consistency round."""
    counts = make_counts(8, seed=61)
    app, directory, _ = signed_setup(counts)
    attacker = sorted(counts)[3]
    grid = InProcessGrid(app, list(counts), reply_hook=altering(attacker, "market_share", _garbage_to_first(4)))
    outcome = MarketPhase(market_config(directory=directory)).run(grid)
    assert set(outcome.excluded) == {attacker} and len(outcome.pass_sessions) == 2
    assert sum(m.metadata.message_type == "query.market_survivors" for m in grid.sent) == 7  # second session only
    honest = [n for n in counts if n != attacker]
    assert outcome.global_counts == _exact_over(counts, honest)
