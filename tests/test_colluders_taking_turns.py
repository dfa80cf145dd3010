"""The DoS bound of the secure profile (issue 39, item 5): colluding clients that take turns to stop PASS.

Each colluder behaves until its turn, then makes its session fail closed before any unmask request (garbage
shares to more receivers than its own threshold spares, or a dealing of a random value and a withheld masked
input). The market runs a fresh session without every client a failed session named, ``pass_reruns`` times at
most; in the secure profile that is the number ``c`` of colluders the profile assumes (a fifth of the pinned
directory, rounded up). Played against drop-in nodes configured by the profile alone (identity keys, the pinned
directory, complete graph, roster floor, split tolerance, noise, ledger) and a buyer in the profile, at their
defaults: ``c`` colluders taking turns are all named and the market finishes over the honest clients; ``c + 1``
stop it with an error that says how many re-runs were used and names every one of them. The nodes' roster floor,
at the profile's own default, bounds both the buyer's exclusions and how far re-runs may shrink the roster.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from adversary import make_counts
from flwr.app import Context, RecordDict
from test_adversarial_pass_robust import _dealing_a_random_value
from test_secure_profile_market import drop_in_app, profile_setup, secure_config

from flmarket_flwr.app.run_config import check_run_config, count_or_auto
from flmarket_flwr.market import MarketConfig, MarketError, MarketPhase
from flmarket_flwr.market.buyer.config import DEFAULT_PASS_RERUNS
from flmarket_flwr.market.node.node_config import PROFILE_SPLIT_TOLERANCE, read_node_settings
from flmarket_flwr.market.wire.messages import RECORD_KEY
from flmarket_flwr.market.wire.profiles import PROFILE_ROSTER_SHARE, profile_colluders
from flmarket_flwr.pass_protocol import MIN_PARTICIPANTS, IdentityDirectory, generate_identity, save_identity_key
from flmarket_flwr.pass_protocol.graph import secret_threshold
from simulations.inprocess_grid import InProcessGrid

Hook = Callable[[Any, Any], Any]


@pytest.fixture(autouse=True)
def ledger_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "flmarket-home"
    monkeypatch.setenv("FLMARKET_HOME", str(home))
    return home


# --- The setting ---------------------------------------------------------------------------------------------
def _directory(size: int) -> IdentityDirectory:
    return IdentityDirectory({1000 + node: generate_identity()[1] for node in range(size)})


@pytest.mark.parametrize("size", [6, 9, 10, 11, 15, 16, 50, 101])
def test_the_secure_profiles_reruns_are_the_colluders_its_nodes_assume(tmp_path: Path, size: int) -> None:
    """One rule on both sides: the buyer's default re-runs are the ``pass-colluders`` default of a node that pins
    the same directory, a fifth of it rounded up; and removing that many from the whole directory leaves a
    roster at the nodes' own floor (two thirds of it), so the re-runs are not cut short by the floor."""
    directory = _directory(size)
    (tmp_path / "directory.json").write_text(directory.to_json())
    save_identity_key(generate_identity()[0], tmp_path / "node.pem")  # the profile's settings are read whole
    node = Context(
        1,
        5,
        {
            "market-security": "malicious",
            "identity-key": str(tmp_path / "node.pem"),
            "identity-directory": str(tmp_path / "directory.json"),
            "identity-directory-digest": directory.digest().hex(),
        },
        RecordDict(),
        {},
    )
    buyer = MarketConfig(budget=1.0, num_classes=2, security="malicious", directory=directory)
    settings = read_node_settings(node)
    assert buyer.pass_reruns == settings.colluders == profile_colluders(size) == math.ceil(size / 5)
    assert size - buyer.pass_reruns >= settings.min_participants


def test_at_every_directory_size_the_profiles_c_fits_under_the_floor_and_the_unmask_thresholds() -> None:
    """The arithmetic behind the threat model's bound, for every pinned directory of 6 to 5,000 nodes all invited:
    removing the ``c`` colluders (one per failed session) never takes the roster below the nodes' floor; and from
    8 nodes on, however the ``c`` split between failed sessions (``r``, named and gone) and withholding their
    shares at the last session's unmask round, every secret keeps its threshold ``t`` of holders
    (``c - r <= k - t`` with ``k = E - 1 - r`` and the profile's split tolerance). At 6 and 7 nodes (``c`` = 2)
    it does not hold: two named leave 4 or 5, too few for split tolerance 2, and two withholding at unmask leave
    a secret short."""
    short = []
    for size in range(6, 5001):
        c = profile_colluders(size)
        assert size - c >= max(MIN_PARTICIPANTS, math.ceil(PROFILE_ROSTER_SHARE * size - 1e-9)), size
        for named in range(c + 1):
            k = size - 1 - named
            try:
                spare = k - secret_threshold(k, PROFILE_SPLIT_TOLERANCE)
            except ValueError:  # fewer than 6 left: split tolerance 2 has no threshold, every node refuses
                spare = -1
            if c - named > spare:
                short.append(size)
    assert sorted(set(short)) == [6, 7]


def test_the_reruns_default_to_two_outside_the_profile_and_any_count_may_be_set() -> None:
    directory = _directory(20)
    assert MarketConfig(budget=1.0, num_classes=2).pass_reruns == DEFAULT_PASS_RERUNS == 2
    assert MarketConfig(budget=1.0, num_classes=2, directory=directory).pass_reruns == 2  # semi-honest
    assert MarketConfig(budget=1.0, num_classes=2, security="malicious", directory=directory).pass_reruns == 4
    for count in (0, 1, 7):
        config = MarketConfig(budget=1.0, num_classes=2, security="malicious", directory=directory, pass_reruns=count)
        assert config.pass_reruns == count


@pytest.mark.parametrize(
    ("value", "error"), [("three", ValueError), ("", ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError)]
)
def test_a_bad_rerun_count_is_refused_naming_the_setting(value: object, error: type) -> None:
    with pytest.raises(error, match="pass_reruns"):
        MarketConfig(budget=1.0, num_classes=2, pass_reruns=value)  # type: ignore[arg-type]


def test_the_run_config_key_reaches_the_market() -> None:
    assert count_or_auto("auto") == "auto" and count_or_auto("5") == 5
    assert check_run_config({"pass-reruns": "5"})["pass-reruns"] == "5"
    for bad in ("-1", "five", "2.5"):
        with pytest.raises(ValueError, match="pass-reruns"):
            check_run_config({"pass-reruns": bad})


# --- The attacks -----------------------------------------------------------------------------------------------
def _garbage_beyond_its_threshold(record: dict) -> None:
    """Garbage to ``k - t + 1`` receivers, ``t`` the threshold the colluder itself announced: its mask key keeps
    ``t - 1`` holders, and the session stops before any unmask request."""
    spared = len(record["receivers"]) - record["threshold"] + 1
    record["ciphertexts"] = [c[:-16] + bytes(16) if i < spared else c for i, c in enumerate(record["ciphertexts"])]


def _taking_turns(turns: Mapping[int, int], withholds: frozenset[int] = frozenset()) -> Hook:
    """A reply hook by which each colluder ``node`` honest until its ``turns[node]``-th PASS session strikes in it:
    garbage shares, or (for those in ``withholds``) no masked input."""
    share_rounds = dict.fromkeys(turns, 0)

    def hook(instruction: Any, reply: Any) -> Any:
        node, kind = instruction.metadata.dst_node_id, instruction.metadata.message_type
        if node not in turns:
            return reply
        if kind == "query.market_share":
            share_rounds[node] += 1
        if share_rounds[node] != turns[node] or reply.has_error():
            return reply
        if kind == "query.market_mask" and node in withholds:
            return None  # the server sees a timeout
        if kind == "query.market_share" and node not in withholds:
            _garbage_beyond_its_threshold(reply.content.config_records[RECORD_KEY])
        return reply

    return hook


def _profile_grid(tmp_path: Path, num_nodes: int, hook: Hook) -> tuple[InProcessGrid, dict, IdentityDirectory]:
    counts = make_counts(num_nodes, seed=39)
    nodes = sorted(counts)
    configs, directory = profile_setup(tmp_path, nodes)
    return InProcessGrid(drop_in_app(counts), nodes, node_configs=configs, reply_hook=hook), counts, directory


def _sent(grid: InProcessGrid, action: str, node: int | None = None) -> int:
    return sum(
        m.metadata.message_type == f"query.{action}" and node in (None, m.metadata.dst_node_id) for m in grid.sent
    )


def _ledgers(ledger_home: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(ledger_home.glob("ledger/*/release-ledger.json"))]


@pytest.mark.parametrize("num_nodes", [10, 16])
@pytest.mark.parametrize("tactic", ["garbage", "mixed"])
def test_c_colluders_taking_turns_are_all_named_and_the_market_finishes_over_the_honest_clients(
    tmp_path: Path, ledger_home: Path, monkeypatch: pytest.MonkeyPatch, num_nodes: int, tactic: str
) -> None:
    """``c`` = 2 (E = 10) or 4 (E = 16) colluders, one per session: each failed session names its colluder, a
    named client is never invited again, and the ``c + 1``-th session releases the honest clients' noisy sum, the
    only sum released: no unmask request went out in a failed session. The cost, stated in the threat model: each
    honest node's ledger charged every session it masked in (``c + 1``), for one release recorded."""
    nodes = sorted(make_counts(num_nodes, seed=39))
    c = profile_colluders(num_nodes)
    colluders = nodes[1 : 1 + c]
    turns = {node: turn for turn, node in enumerate(colluders, start=1)}
    withholds = frozenset(colluders[1::2]) if tactic == "mixed" else frozenset()
    for node in withholds:
        _dealing_a_random_value(monkeypatch, node)
    grid, counts, directory = _profile_grid(tmp_path, num_nodes, _taking_turns(turns, withholds))
    config = secure_config(directory)
    assert config.pass_reruns == c

    outcome = MarketPhase(config).run(grid)

    assert outcome.status == "succeeded" and set(outcome.excluded) == set(colluders)
    for node in colluders:
        reason = "mis-dealt shares" if node in withholds else "garbage shares"
        assert reason in outcome.excluded[node]
    assert [session.named for session in outcome.pass_sessions] == [[node] for node in colluders] + [[]]
    for turn, session in enumerate(outcome.pass_sessions):
        assert session.roster == [node for node in nodes if node not in colluders[:turn]]
    for node in colluders:  # named once: invited to its own session and those before, never after
        assert _sent(grid, "market_advertise", node) == turns[node]
    honest = [node for node in nodes if node not in colluders]
    assert outcome.pass_participants == honest
    assert _sent(grid, "market_unmask") == len(honest)  # the last session's unmask round only
    exact = np.sum([counts[node] for node in honest], axis=0)
    with_colluders = np.sum([counts[node] for node in nodes], axis=0)
    noisy = np.array(outcome.global_counts)
    assert np.abs(noisy - exact).max() <= config.noise_tolerance
    assert np.abs(noisy - exact).sum() < np.abs(noisy - with_colluders).sum() / 4  # the colluders' counts are out
    assert outcome.winners and set(outcome.winners) <= set(honest)
    ledgers = _ledgers(ledger_home)
    assert len(ledgers) == num_nodes
    spends = sorted(len(ledger["spent"]) for ledger in ledgers)
    releases = sorted(len(ledger["records"]) for ledger in ledgers)
    assert spends.count(c + 1) == len(honest)  # every honest node: one charge per session it masked in
    assert releases.count(1) == len(honest) and releases.count(0) == c  # one release, which no colluder joined


@pytest.mark.parametrize("num_nodes", [10, 16])
def test_colluders_striking_together_are_named_in_one_session_and_use_one_rerun(tmp_path: Path, num_nodes: int) -> None:
    """A session names every colluder caught in it: ``c`` colluders striking at once use one re-run, not ``c``."""
    nodes = sorted(make_counts(num_nodes, seed=39))
    colluders = nodes[2 : 2 + profile_colluders(num_nodes)]
    grid, _, directory = _profile_grid(tmp_path, num_nodes, _taking_turns(dict.fromkeys(colluders, 1)))
    outcome = MarketPhase(secure_config(directory)).run(grid)
    assert [session.named for session in outcome.pass_sessions] == [colluders, []]
    assert set(outcome.excluded) == set(colluders)
    assert outcome.pass_participants == [node for node in nodes if node not in colluders]


@pytest.mark.parametrize("num_nodes", [10, 16])
def test_c_plus_one_colluders_taking_turns_stop_the_market_naming_every_one_and_the_reruns_used(
    tmp_path: Path, num_nodes: int
) -> None:
    """One colluder more than the profile assumes: the ``c + 1``-th failed session finds every re-run used. The
    market stops before any sum is released (no unmask request, no bid) with an error that names the re-runs
    used and all ``c + 1`` colluders, session by session; every contacted node is told the market closed."""
    nodes = sorted(make_counts(num_nodes, seed=39))
    c = profile_colluders(num_nodes)
    colluders = nodes[1 : 2 + c]
    grid, _, directory = _profile_grid(tmp_path, num_nodes, _taking_turns({n: t for t, n in enumerate(colluders, 1)}))
    with pytest.raises(MarketError) as caught:
        MarketPhase(secure_config(directory)).run(grid)
    message = str(caught.value)
    assert f"{c + 1} PASS session(s) ran, the first and {c} re-run(s) of at most {c}" in message
    assert f"naming {c + 1} client(s) {colluders}" in message and "no re-run: every re-run allowed is used" in message
    for turn, node in enumerate(colluders, start=1):
        assert f"session {turn}: [{node}]" in message
    outcome = caught.value.outcome
    assert outcome is not None and outcome.status == "failed" and outcome.winners == []
    assert [session.named for session in outcome.pass_sessions] == [[node] for node in colluders]
    assert set(colluders) <= set(outcome.excluded)
    assert _sent(grid, "market_unmask") == _sent(grid, "market_bid") == 0
    assert {m.metadata.dst_node_id for m in grid.sent if m.metadata.message_type == "query.market_award"} == set(nodes)


def test_one_more_rerun_outlasts_the_extra_colluder(tmp_path: Path) -> None:
    """The setting is the bound: the same ``c + 1`` colluders with ``pass_reruns = c + 1`` are all named and the
    market finishes."""
    nodes = sorted(make_counts(10, seed=39))
    colluders = nodes[1:4]
    grid, _, directory = _profile_grid(tmp_path, 10, _taking_turns({n: t for t, n in enumerate(colluders, 1)}))
    outcome = MarketPhase(secure_config(directory, pass_reruns=3)).run(grid)
    assert [session.named for session in outcome.pass_sessions] == [[node] for node in colluders] + [[]]
    assert outcome.pass_participants == [node for node in nodes if node not in colluders]


# --- The roster floor at the profile's default (two thirds of the pinned directory) ------------------------------
def test_a_roster_shaped_below_the_profiles_default_floor_is_refused_by_every_node(
    tmp_path: Path, ledger_home: Path
) -> None:
    """``tests/test_adversarial_relaunch.py``'s roster test pins ``pass-min-participants=7``; here the nodes keep
    the profile's own floor, ``ceil(2/3 x 9) = 6``. The buyer excludes four nodes (three by id, one by the tag it
    declares) to invite five: every invited node refuses at the share round, before a share or a masked input
    leaves it, and spends nothing. Excluding three (a roster of six, at the floor) runs."""
    counts = make_counts(9, seed=40)
    nodes = sorted(counts)
    for excluded, runs in (((*nodes[:3], "rival"), False), ((*nodes[:2], "rival"), True)):
        home = tmp_path / ("runs" if runs else "refused")
        home.mkdir()
        configs, directory = profile_setup(home, nodes)
        configs[nodes[-1]]["market-tag"] = "rival"
        grid = InProcessGrid(drop_in_app(counts), nodes, node_configs=configs)
        config = secure_config(directory, exclude=excluded)
        invited = [node for node in nodes if node not in (*nodes[: len(excluded) - 1], nodes[-1])]
        if runs:
            outcome = MarketPhase(config).run(grid)
            assert outcome.status == "succeeded" and outcome.pass_participants == invited == nodes[2:-1]
            continue
        with pytest.raises(MarketError) as caught:
            MarketPhase(config).run(grid)
        reasons = caught.value.outcome.excluded  # type: ignore[union-attr]
        assert len(invited) == 5 and all(reasons[node].startswith("market_share") for node in invited)
        assert _sent(grid, "market_mask") == 0
        assert sum(len(ledger["spent"]) for ledger in _ledgers(ledger_home)) == 0  # no node spent


def test_the_roster_floor_bounds_the_colluders_any_number_of_reruns_outlasts(tmp_path: Path) -> None:
    """Re-runs shrink the roster: with re-runs to spare (6), four colluders taking turns in a directory of 9 bring
    it to 5, below the nodes' floor of 6, and there every honest node refuses at the share round. So the market
    outlasts at most ``min(pass_reruns, invited - floor)`` colluders taking turns (3 here; the profile's ``c`` =
    2 fits under it at every directory size: ``test_the_secure_profiles_reruns_are_the_colluders_its_nodes_assume``)."""
    nodes = sorted(make_counts(9, seed=39))
    colluders = nodes[1:5]
    grid, _, directory = _profile_grid(tmp_path, 9, _taking_turns({n: t for t, n in enumerate(colluders, 1)}))
    with pytest.raises(MarketError) as caught:
        MarketPhase(secure_config(directory, pass_reruns=6)).run(grid)
    assert "5 PASS session(s) ran, the first and 4 re-run(s) of at most 6" in str(caught.value)
    outcome = caught.value.outcome
    assert outcome is not None
    *failed, last = outcome.pass_sessions
    assert [session.named for session in failed] == [[node] for node in colluders]
    honest = [node for node in nodes if node not in colluders]
    assert last.roster == last.named == honest
    assert all(outcome.excluded[node].startswith("market_share") for node in honest)
    assert _sent(grid, "market_unmask") == 0


# --- After the unmask request, and the nodes' privacy budgets: what re-runs cannot cover ---------------------------
def _withholding_at_unmask(colluders: list[int]) -> Hook:
    def hook(instruction: Any, reply: Any) -> Any:
        if instruction.metadata.dst_node_id in colluders and instruction.metadata.message_type == "query.market_unmask":
            return None
        return reply

    return hook


@pytest.mark.parametrize(("num_nodes", "finishes"), [(7, False), (8, True), (16, True)])
def test_c_colluders_withholding_their_unmask_shares_stop_the_market_only_below_eight_nodes(
    tmp_path: Path, num_nodes: int, finishes: bool
) -> None:
    """No re-run follows an unmask request (a second session would be a second sum), so there the colluders need
    no turns: they withhold their shares together. Each secret has ``k - t`` holders to spare at the profile's
    split tolerance, at least ``c`` from E = 8 on (E = 8: k = 7, t = 5, c = 2): the sum is released over everyone
    who masked. At E = 7 (k = 6, t = 5, c = 2) the same two stop the market, and nothing follows."""
    nodes = sorted(make_counts(num_nodes, seed=39))
    colluders = nodes[1 : 1 + profile_colluders(num_nodes)]
    grid, _, directory = _profile_grid(tmp_path, num_nodes, _withholding_at_unmask(colluders))
    phase = MarketPhase(secure_config(directory))
    if finishes:
        outcome = phase.run(grid)
        assert outcome.pass_participants == nodes and len(outcome.pass_sessions) == 1
        assert set(outcome.excluded) == set(colluders)  # no reply at the unmask round: out of the rest of the market
        return
    with pytest.raises(MarketError, match="no re-run: the unmask round had begun"):
        phase.run(grid)
    assert len(phase.pass_sessions) == 1 and _sent(grid, "market_bid") == 0


def test_every_failed_session_is_charged_so_the_nodes_budget_also_bounds_the_colluders_outlasted(
    tmp_path: Path,
) -> None:
    """A failed session released nothing, but each honest node charged its ledger when it masked (write-ahead: a
    buyer could have had its neighbours unmask that session). With a budget of two releases
    (``pass-dp-total-epsilon=1.5``; epsilon 1 per release composes to 1.45 over two, 1.81 over three), two
    colluders taking turns leave the honest nodes nothing for the third session: they refuse to mask, naming
    their privacy budget, though ``pass_reruns`` (2) had a re-run left for it."""
    counts = make_counts(10, seed=39)
    nodes = sorted(counts)
    colluders = nodes[1:3]
    configs, directory = profile_setup(tmp_path, nodes)
    for node in nodes:
        configs[node]["pass-dp-total-epsilon"] = 1.5
    hook = _taking_turns({node: turn for turn, node in enumerate(colluders, start=1)})
    grid = InProcessGrid(drop_in_app(counts), nodes, node_configs=configs, reply_hook=hook)
    with pytest.raises(MarketError) as caught:
        MarketPhase(secure_config(directory)).run(grid)
    outcome = caught.value.outcome
    assert outcome is not None and [session.named for session in outcome.pass_sessions][:2] == [[n] for n in colluders]
    honest = [node for node in nodes if node not in colluders]
    assert outcome.pass_sessions[2].roster == honest
    assert all("privacy budget" in outcome.excluded[node] for node in honest)
    assert _sent(grid, "market_unmask") == 0
