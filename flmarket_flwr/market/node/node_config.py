"""The market's node-config schema, the node's settings read from it, and a ``ClientApp`` mod that checks it.

Each key is one a SuperNode's operator sets for the market, with its type, default, check and meaning. The mod
refuses an unknown key, a run-config key, or a value that cannot work; :func:`read_node_settings` turns a node
config into the frozen :class:`NodeSettings` the market's handlers get at each message. An app declares its own
keys and builds its schema (``MARKET_SCHEMA.extended(app_keys, run_config_keys=...)``); ``python -m
flmarket_flwr.market.node.node_config`` prints the market's keys.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from logging import WARNING
from pathlib import Path
from typing import Any, Final, NoReturn

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.app import ConfigRecord, Context, Error, Message
from flwr.common.config import parse_config_args
from flwr.common.constant import ErrorCode
from flwr.supercore import log

from flmarket_flwr.market.wire.config_keys import Scalar, at_least, check_value, one_of, typed_value
from flmarket_flwr.market.wire.ledger import (
    DEFAULT_MIN_ROSTER_CHANGE,
    DEFAULT_REDRAW_WAIT,
    DrawAllowance,
    ReleaseLedger,
)
from flmarket_flwr.market.wire.profiles import (
    PROFILE_DROPOUT,
    SECURITY_PROFILES,
    profile_colluders,
    profile_roster_floor,
)
from flmarket_flwr.pass_protocol.graph_parameters import DEFAULT_SECURITY_BITS
from flmarket_flwr.pass_protocol.identity import (
    IdentityDirectory,
    bind_members,
    load_directory,
    load_identity_key,
    parse_digest,
    parse_public_key,
    unpack_member_bindings,
)
from flmarket_flwr.pass_protocol.noise import (
    MIN_HONEST_CLIENTS,
    SECURE_PROFILE_DELTA,
    SECURE_PROFILE_EPSILON,
    SECURE_PROFILE_TOTAL_EPSILON,
    PrivacyBudget,
    SkellamNoise,
)
from flmarket_flwr.pass_protocol.primitives import MIN_PARTICIPANTS, is_integer
from flmarket_flwr.pass_protocol.sparse_secure import DEFAULT_MARKETS, SparseSecureSettings

__all__ = [
    "MARKET_NODE_KEYS",
    "MARKET_SCHEMA",
    "NodeConfigCheck",
    "NodeConfigSchema",
    "NodeKey",
    "NodeSettings",
    "check_noise_ceiling",
    "read_node_settings",
]

_TRUE_FALSE: Final = {"true": True, "false": False}
PROFILE_SPLIT_TOLERANCE: Final = 2
"""The secure profile's ``pass-split-tolerance`` when unset: two colluders cannot split the consistency round."""
LEDGER_HOME_ENV: Final = "FLMARKET_HOME"
"""Where the secure profile keeps a node's ledger when ``market-ledger-dir`` is unset (default ``~/.flmarket``)."""
NODE_CONFIG_ENV: Final = "FLMARKET_NODE_CONFIG"
"""Market node-config keys for every node of the process, under each node's own node config, in Flower's
``key=value`` syntax; ``{partition-id}`` (any key of the node's own node config, in braces) in a value becomes the
node's own. For Flower's simulation, whose nodes hold their partition only (docs/deployment.md, "The secure profile
in simulation")."""
IDENTITY_STATE_KEY: Final = "flmarket-identity"
"""The node's ``context.state`` record of this run's member bindings (a directory keyed by member)."""


@dataclass(frozen=True)
class NodeKey:
    """One node-config key.

    Attributes
    ----------
    name : str
        The key as ``--node-config`` writes it (``-`` separated).
    kind : type
        ``bool``, ``int``, ``float`` or ``str``.
    default : bool, int, float, str or None
        Its value when absent; ``None``: no default (whoever reads it requires it).
    meaning : str
        What it does, one line.
    check : callable, optional
        ``value -> bool``: whether a well-typed value can work.
    expected : str
        What :attr:`check` asks for, for the error message.
    """

    name: str
    kind: type
    default: Scalar | None
    meaning: str
    check: Callable[[Any], bool] | None = None
    expected: str = ""

    def parse(self, value: Any) -> Scalar:
        """``value`` typed and checked; a ``ValueError`` naming the key otherwise.

        Node-config values may arrive as strings (a quoted ``--node-config`` value): ``"true"``/``"false"`` for a
        bool, ASCII digits for an int, a decimal for a float are read as such; anything else is refused, so that a
        typo never silently leaves the node at the default.
        """
        if isinstance(value, str) and self.kind is not str:
            value = _from_text(value.strip(), self.kind)
        typed = typed_value("node", self.name, value, self.kind, self.default)
        check_value("node", self.name, typed, self.check, self.expected)
        return typed


def _from_text(text: str, kind: type) -> Any:
    """``text`` as a ``kind`` where it spells one exactly, else unchanged (then refused by its type)."""
    if kind is bool and text.lower() in _TRUE_FALSE:
        return _TRUE_FALSE[text.lower()]
    if kind is int and text.isascii() and text.isdigit():
        return int(text)
    if kind is float:
        try:
            return float(text)
        except ValueError:
            return text
    return text


def _finite_at_least_zero(value: float) -> bool:
    return 0.0 <= value < math.inf


def _hex_digest_or_empty(value: str) -> bool:
    return _parses(parse_digest, value)


def _public_key_or_empty(value: str) -> bool:
    return _parses(parse_public_key, value)


def _parses(parse: Callable[[str, str], bytes], value: str) -> bool:
    if not value:
        return True
    try:
        parse(value, "")
    except ValueError:
        return False
    return True


MARKET_NODE_KEYS: Final[tuple[NodeKey, ...]] = (
    # The profile: one key that turns on every defence the threat model needs against a malicious server.
    NodeKey("market-security", str, "semi-honest", "semi-honest, or malicious: the secure profile (identity key, "
            "pinned directory, the complete graph or a graph the clients draw, roster floor, split tolerance, noise, "
            "privacy budget, ledger)",
            one_of(profile.replace("-", "_") for profile in SECURITY_PROFILES), f"one of {list(SECURITY_PROFILES)}"),
    # Identity: the node's key, and the directory it checks its neighbours against, pinned.
    NodeKey("identity-key", str, "", 'path of this node\'s Ed25519 identity key (PKCS#8 PEM); "" signs nothing'),
    NodeKey("identity-directory", str, "", 'path of the directory of identity keys (JSON) the node checks its '
            'neighbours against; "" for none'),
    NodeKey("identity-directory-digest", str, "", "SHA-256 (64 hex) of the directory this node trusts "
            '(identity_cli digest); "" for none', _hex_digest_or_empty, '64 hex digits, or ""'),
    NodeKey("identity-directory-signer", str, "", "Ed25519 public key (64 hex) of the third party that must have "
            'signed the directory; "" for none', _public_key_or_empty, 'an Ed25519 public key in 64 hex digits, or ""'),
    NodeKey("identity-directory-unpinned", bool, False, "true: take the directory with neither pin (only where "
            "this node's operator wrote it, never the buyer)"),
    NodeKey("identity-member", int, -1, "this node's member number in a directory keyed by member (identity_cli make "
            "--members; e.g. its partition); -1: the directory lists Flower node ids", at_least(-1), ">= -1"),
    NodeKey("market-tag", str, "", 'a label the buyer may include or exclude this node by (run config market-include '
            '/ market-exclude "tag:<label>"); the node\'s own word, sent to the buyer before a market that asks; '
            '"" for none'),
    NodeKey("market-buyer-key", str, "", 'the buyer\'s Ed25519 public key (64 hex) this node pins; "" for none',
            _public_key_or_empty, 'an Ed25519 public key in 64 hex digits, or ""'),
    NodeKey("market-endorse-tolerance", int, -1, "the survivors that may withhold their endorsement of an award "
            "this node opens for: d >= 0 also needs survivors - d endorsements, so that after seeing the bids the "
            "buyer can leave at most d honest bidders out (and any survivor lost after the unmask beyond d stops the "
            "market); -1: the binding quorum alone", at_least(-1), ">= -1 (-1: the quorum alone)"),
    # PASS: the rosters and graphs the node takes part in.
    NodeKey("pass-complete-graph", bool, False, "true: take part in PASS only on the complete graph"),
    NodeKey("pass-min-participants", int, MIN_PARTICIPANTS, "the smallest PASS roster the node takes part in",
            at_least(MIN_PARTICIPANTS), f">= {MIN_PARTICIPANTS}"),
    NodeKey("pass-colluders", int, 0, "colluding clients (the buyer's allies: they add no noise and share what "
            "they see) the node's guarantees assume at most; the secure profile: a fifth of the pinned directory",
            at_least(0), ">= 0"),
    NodeKey("pass-split-tolerance", int, 0, "colluding neighbours the node's secrets withstand in a split "
            "consistency round (raises its Shamir threshold)", at_least(0), ">= 0"),
    NodeKey("pass-dropout", float, PROFILE_DROPOUT, "the secure profile's sparse mode: the dropout its degrees are "
            "sized for (a session announcing less is refused)", lambda value: 0.0 <= value < 1.0, "in [0, 1)"),
    NodeKey("pass-reruns", int, -1, "the secure profile's sparse mode: the sessions the node draws in beyond the "
            "first, per release or per pass-redraw-wait, whatever a session announces; -1: the profile's colluders",
            at_least(-1), ">= -1 (-1: pass-colluders)"),
    NodeKey("pass-security-bits", int, DEFAULT_SECURITY_BITS, "the secure profile's sparse mode: the security level "
            "2^-bits its degrees are sized for (a session announcing fewer is refused)", at_least(1), ">= 1"),
    NodeKey("pass-markets", int, DEFAULT_MARKETS, "the secure profile's sparse mode: the markets over the node's life "
            "its degrees are sized for, pass-reruns + 1 draws each (a session announcing fewer placements is "
            "refused; past them the node refuses the mode)", at_least(1), ">= 1"),
    NodeKey("pass-redraw-wait", float, DEFAULT_REDRAW_WAIT, "the secure profile's sparse mode: seconds after which "
            "a draw that brought no release stops counting against pass-reruns + 1 (the longest a buyer that stops "
            "its sessions locks the node out)", _finite_at_least_zero, ">= 0 and finite"),
    # Releases: the node's ledger and its noise.
    NodeKey("market-ledger-dir", str, "", 'folder of the node\'s release ledger; "" for none'),
    NodeKey("market-min-roster-change", int, DEFAULT_MIN_ROSTER_CHANGE, "smallest group two releases of the "
            "node's counts may differ by (with market-ledger-dir)", at_least(1), ">= 1"),
    NodeKey("pass-dp-max-epsilon", float, 0.0, "refuse a run whose pass-dp-* noise is weaker than this epsilon "
            "needs; 0: no ceiling", _finite_at_least_zero, ">= 0 and finite (0: none)"),
    NodeKey("pass-dp-total-epsilon", float, 0.0, "the node's epsilon over all its releases, composed (kept in "
            "market-ledger-dir); 0: no privacy budget", _finite_at_least_zero, ">= 0 and finite (0: none)"),
    NodeKey("pass-dp-total-delta", float, SECURE_PROFILE_DELTA, "the delta pass-dp-total-epsilon is counted at",
            lambda value: 0.0 < value < 1.0, "in (0, 1)"),
)  # fmt: skip
"""Every node-config key of the market."""


class NodeConfigSchema:
    """The node-config keys one ``ClientApp`` reads: the market's and the app's own.

    Parameters
    ----------
    keys : iterable of NodeKey
        The keys (names must be unique).
    run_config_keys : iterable of str
        The app's run-config keys: given as node config, each is refused with an error that says so (a name
        that is also a node-config key, such as ``identity-directory``, names each side's own setting).

    Raises
    ------
    ValueError
        If two keys share a name.
    """

    def __init__(self, keys: Iterable[NodeKey], *, run_config_keys: Iterable[str] = ()) -> None:
        self.keys: tuple[NodeKey, ...] = tuple(keys)
        self._by_name = {key.name: key for key in self.keys}
        if len(self._by_name) != len(self.keys):
            raise ValueError("two node-config keys share one name")
        self.run_config_keys = frozenset(run_config_keys) - set(self._by_name)  # a name on both sides is a node key

    def extended(self, keys: Iterable[NodeKey], *, run_config_keys: Iterable[str] = ()) -> NodeConfigSchema:
        """This schema with an app's own keys and its run-config keys added."""
        return NodeConfigSchema((*self.keys, *keys), run_config_keys=self.run_config_keys | set(run_config_keys))

    def value(self, node_config: Mapping[str, Any], name: str) -> Scalar | None:
        """Key ``name`` of ``node_config``, typed and checked, or its default when absent."""
        key = self._by_name[name]
        return key.parse(node_config[name]) if name in node_config else key.default

    def check(self, node_config: Mapping[str, Any]) -> dict[str, Scalar | None]:
        """The whole node config, typed and checked, with every absent key at its default.

        Raises
        ------
        ValueError
            For a run-config key given as node config, an unknown key, or a value of the wrong type or that its
            check refuses, naming the key.
        """
        misplaced = sorted(set(node_config) & self.run_config_keys)
        if misplaced:
            raise ValueError(
                f"node-config key(s) {misplaced} are run-config keys: a SuperNode's node config does not set them; "
                "give them with flwr run --run-config"
            )
        unknown = sorted(set(node_config) - set(self._by_name))
        if unknown:
            raise ValueError(
                f"unknown node-config key(s) {unknown}: python -m flmarket_flwr.market.node.node_config lists the "
                "market's"
            )
        return {key.name: self.value(node_config, key.name) for key in self.keys}

    def markdown(self) -> str:
        """The keys as a Markdown table (key, type, default, meaning, what a value must be)."""
        lines = ["| key | type | default | meaning | a value must be |", "| --- | --- | --- | --- | --- |"]
        for key in self.keys:
            shown = "(required)" if key.default is None else _shown(key.default)
            meaning = key.meaning.replace("|", "\\|")
            lines.append(f"| `{key.name}` | {key.kind.__name__} | `{shown}` | {meaning} | {key.expected or 'any'} |")
        return "\n".join(lines) + "\n"

    def table(self) -> str:
        """The keys as ``--node-config`` takes them, one per line with its default and meaning."""
        width = max(len(key.name) for key in self.keys)
        lines = []
        for key in self.keys:
            shown = "(required)" if key.default is None else _shown(key.default)
            lines.append(f"{key.name:<{width}}  {key.kind.__name__:<5}  {shown:<10}  {key.meaning}")
        return "\n".join(lines) + "\n"


def _shown(value: Scalar) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return '""' if value == "" else str(value)


MARKET_SCHEMA: Final = NodeConfigSchema(MARKET_NODE_KEYS)
"""The market's node-config keys alone (an app extends it with its own: :meth:`NodeConfigSchema.extended`)."""


class NodeConfigCheck:
    """``ClientApp`` mod: every message is refused while the node config fails ``schema`` (:meth:`~.check`).

    The reason goes to the node's own log; the server gets a generic error. A module-level class, so that Ray can
    pickle the ``ClientApp`` that carries it.
    """

    def __init__(self, schema: NodeConfigSchema) -> None:
        self.schema = schema

    def __call__(self, msg: Message, context: Context, call_next: Any) -> Message:
        """Check the node config, then run the next mod or the handler."""
        try:
            self.schema.check(context.node_config)
        except ValueError as error:
            log(WARNING, "Message %s refused: %s", msg.metadata.message_type, error)
            reason = f"flmarket: {msg.metadata.message_type}: the node's config is refused (see the node's log)"
            return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=msg)
        return call_next(msg, context)


# --- The node's settings: read once per message ------------------------------------------------------------------
@dataclass(frozen=True)
class NodeSettings:
    """What the market's handlers need from a node's own configuration, read once per message.

    :func:`read_node_settings` builds it from ``context.node_config`` (every market key through
    :data:`MARKET_SCHEMA`), with the secure profile's defaults applied; the handlers get it at each message and
    never read the node config themselves. A node that needs something else passes its own (all fields have the
    semi-honest defaults of an empty node config), usually ``dataclasses.replace(read_node_settings(context),
    ...)``.

    Attributes
    ----------
    security : {"semi-honest", "malicious"}
        The node's profile (``market-security``); ``"malicious"`` is the secure profile.
    identity_key : Ed25519PrivateKey or None
        The node's identity key: it signs its PASS key advertisement, its survivor set and its endorsement.
    directory : IdentityDirectory or None
        The pinned directory of identity keys the node checks its neighbours against (the consistency round, the
        endorsement quorum); without it PASS is secure against a semi-honest server only. With a directory keyed by
        member, this run's bound directory (node id -> key, from the bind step; empty before it, so that every check
        against it fails closed).
    member_directory : IdentityDirectory or None
        The pinned directory keyed by member (``identity_cli make --members``), whose members the bind step binds
        to this run's node ids; ``None`` for a directory keyed by node id.
    member : int
        This node's member number in ``member_directory`` (node config ``identity-member``; ``-1``: none).
    tag : str
        The node's ``market-tag`` (``""``: none), told to a buyer that includes or excludes nodes by tag.
    buyer_key : bytes or None
        The buyer's Ed25519 public key (32 bytes) the node pins: it refuses terms that name another.
    complete_graph : bool
        Take part in PASS only on the complete graph (docs/threat-model.md: with ``min_participants`` close to the
        federation's size and a directory), or in the sparse secure mode under ``sparse``.
    sparse : SparseSecureSettings or None
        The settings under which the node takes part in the sparse secure mode of PASS (each client draws its own
        out-neighbours; docs/threat-model.md, "The sparse secure profile"): a session announcing weaker ones is
        refused. ``None``: the node refuses that mode (outside the secure profile, or ``pass-complete-graph=true``
        set in it).
    redraw_wait : float
        Seconds (``pass-redraw-wait``) after which a draw of the sparse mode that brought no release stops counting
        against the node's ``reruns + 1`` (:attr:`draw_allowance`).
    min_participants : int
        The smallest PASS roster the node takes part in (below 3 counts as 3).
    colluders : int
        How many colluding clients the node's guarantees assume at most (its noise, the binding quorum).
    endorse_tolerance : int
        ``d``, the survivors that may withhold their endorsement of an award this node opens for (node config
        ``market-endorse-tolerance``): with ``d >= 0`` the node, as a winner, also needs ``S - d`` endorsements, ``S``
        the award's survivors, counted over the survivors it was shown (:func:`~flmarket_flwr.market.wire.award.
        opening_quorum`); ``-1``: the binding quorum alone.
    split_tolerance : int
        How many colluding neighbours the node's secrets withstand in a split consistency round.
    release_ledger : ReleaseLedger or None
        The node's release ledger (differencing checks, privacy spends); with ``privacy_budget`` it refuses a
        release past the privacy budget.
    noise_ceiling : float
        The node's own epsilon ceiling (``pass-dp-max-epsilon``; 0: none): weaker announced noise is refused.
    privacy_budget : PrivacyBudget or None
        The node's total ``(epsilon, delta)`` over all its releases (``pass-dp-total-epsilon``), kept in the
        release ledger.
    noise : SkellamNoise or None
        The distributed-DP noise the node adds to its counts, sized for ``colluders``; ``None``: exact counts.
    audit : bool
        Whether the node, as a paid winner of the award it endorsed, opens its counts commitment to the buyer.
        Not a node-config key: a node that never opens (and so is never paid) sets it to ``False``.

    Raises
    ------
    TypeError
        If a field has the wrong type (a string where a bool or an int is needed, a key of the wrong length).
    """

    security: str = SECURITY_PROFILES[0]
    identity_key: Ed25519PrivateKey | None = None
    directory: IdentityDirectory | None = None
    member_directory: IdentityDirectory | None = None
    member: int = -1
    tag: str = ""
    buyer_key: bytes | None = None
    complete_graph: bool = False
    sparse: SparseSecureSettings | None = None
    redraw_wait: float = DEFAULT_REDRAW_WAIT
    min_participants: int = MIN_PARTICIPANTS
    colluders: int = 0
    endorse_tolerance: int = -1
    split_tolerance: int = 0
    release_ledger: ReleaseLedger | None = None
    noise_ceiling: float = 0.0
    privacy_budget: PrivacyBudget | None = None
    noise: SkellamNoise | None = None
    audit: bool = True

    def __post_init__(self) -> None:
        if self.security not in SECURITY_PROFILES:
            raise TypeError(f"security must be one of {list(SECURITY_PROFILES)}, got {self.security!r}")
        for name in ("complete_graph", "audit"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        for name in ("min_participants", "colluders", "endorse_tolerance", "split_tolerance"):
            value = getattr(self, name)
            if not is_integer(value):
                raise TypeError(f"{name} must be an int, got {value!r}")
        if self.sparse is not None and not isinstance(self.sparse, SparseSecureSettings):
            raise TypeError(f"sparse must be SparseSecureSettings or None, got {self.sparse!r}")
        if self.buyer_key is not None and not (isinstance(self.buyer_key, bytes) and len(self.buyer_key) == 32):
            raise TypeError(f"buyer_key must be 32 bytes (a raw Ed25519 public key), got {self.buyer_key!r}")

    @property
    def secure(self) -> bool:
        """Whether the node runs the secure profile."""
        return self.security == "malicious"

    @property
    def draw_allowance(self) -> DrawAllowance | None:
        """How often the node draws in the sparse secure mode, from its own settings (never a session's): ``reruns +
        1`` draws a release or a ``redraw_wait``, ``(reruns + 1) x markets`` over its life; ``None`` outside it."""
        if self.sparse is None:
            return None
        return DrawAllowance(self.sparse.reruns + 1, self.sparse.placements, self.redraw_wait)


def read_node_settings(context: Context, announced_noise: SkellamNoise | None = None) -> NodeSettings:
    """The node's :class:`NodeSettings` from ``context.node_config``, the secure profile's defaults applied here.

    ``announced_noise`` is the run's noise setting where the app reads one (the example app: the run config's
    ``pass-dp-*`` keys); the node adds it, checked against its own ceiling, and in the secure profile adds the
    profile's noise when the run announces none.

    In the secure profile (``market-security=malicious``) the settings are what the threat model needs against a
    malicious server, and a node config that would weaken them is refused, naming the key:

    * ``identity-key`` and ``identity-directory`` are required, and the directory must be pinned
      (``identity-directory-digest`` or ``-signer``; ``identity-directory-unpinned`` is refused);
    * ``pass-complete-graph`` is on (``false`` is refused);
    * ``pass-min-participants`` defaults to two thirds of the pinned directory, ``pass-split-tolerance`` to 2,
      ``pass-colluders`` to a fifth of the directory (:func:`~flmarket_flwr.market.wire.profiles.profile_colluders`);
    * noise on the counts: at least epsilon :data:`SECURE_PROFILE_EPSILON` per release (``pass-dp-max-epsilon``
      defaults to it), within a composed privacy budget (``pass-dp-total-epsilon`` defaults to
      :data:`SECURE_PROFILE_TOTAL_EPSILON`), kept in the node's release ledger, which defaults to
      ``$FLMARKET_HOME/ledger/<identity key fingerprint>`` (``~/.flmarket`` without ``FLMARKET_HOME``).

    The identity key and the directory are read from their files once per process and kept by the files' content
    digest (a changed file is read again).

    Raises
    ------
    ValueError
        Naming the node-config key, for a value of the wrong type, one its check refuses, or a setting the profile
        refuses or needs; or if the announced noise is weaker than the node's ``pass-dp-max-epsilon``.
    """
    config = node_config_of(context)
    value = _ConfigValues(config)
    secure = _profile(str(value("market-security"))) == "malicious"
    identity_key = _identity_key(value, secure)
    pinned = _identity_directory(value, secure)
    member = int(value("identity-member"))
    directory, member_directory = _run_directory(context, pinned, member)
    directory_size = pinned.members if pinned is not None else 0
    colluders = int(value("pass-colluders"))
    if secure and "pass-colluders" not in config:
        colluders = profile_colluders(directory_size)
    privacy_budget = _privacy_budget(value, secure, "pass-dp-total-epsilon" in config)
    noise_ceiling = float(value("pass-dp-max-epsilon"))
    if secure and "pass-dp-max-epsilon" not in config:
        noise_ceiling = SECURE_PROFILE_EPSILON
    if announced_noise is None and secure:
        announced_noise = SkellamNoise(SECURE_PROFILE_EPSILON, SECURE_PROFILE_DELTA)
    min_participants = _min_participants(value, secure, "pass-min-participants" in config, directory_size, colluders)
    return NodeSettings(
        security="malicious" if secure else "semi-honest",
        identity_key=identity_key,
        directory=directory,
        member_directory=member_directory,
        member=member if member_directory is not None else -1,
        tag=str(value("market-tag")),
        buyer_key=_buyer_key(value),
        complete_graph=_complete_graph(value, secure, "pass-complete-graph" in config),
        sparse=_sparse_settings(value, secure and "pass-complete-graph" not in config, colluders, min_participants),
        redraw_wait=float(value("pass-redraw-wait")),
        min_participants=min_participants,
        colluders=colluders,
        endorse_tolerance=int(value("market-endorse-tolerance")),
        split_tolerance=(
            PROFILE_SPLIT_TOLERANCE
            if secure and "pass-split-tolerance" not in config
            else int(value("pass-split-tolerance"))
        ),
        release_ledger=_release_ledger(value, secure, identity_key, privacy_budget),
        noise_ceiling=noise_ceiling,
        privacy_budget=privacy_budget,
        noise=_sized_noise(check_noise_ceiling(announced_noise, noise_ceiling), colluders),
    )


class _ConfigValues:
    """``name -> value`` of one node config through :data:`MARKET_SCHEMA` (typed, checked, default when absent)."""

    def __init__(self, node_config: Mapping[str, Any]) -> None:
        self._node_config = node_config

    def __call__(self, name: str) -> Any:
        return MARKET_SCHEMA.value(self._node_config, name)


def _profile(spelled: str) -> str:
    """The profile in its one spelling (:data:`SECURITY_PROFILES`): ``semi_honest`` is read as ``semi-honest``."""
    return spelled.lower().replace("_", "-")


def _profile_requires(name: str) -> NoReturn:
    raise ValueError(f"node-config market-security=malicious needs {name}: set it in the SuperNode's --node-config")


def node_config_of(context: Context) -> dict[str, Any]:
    """The node's node config: ``context.node_config`` over the market keys of ``$FLMARKET_NODE_CONFIG`` (if set),
    each ``{key}`` in those values replaced by the node's own ``key`` (:data:`NODE_CONFIG_ENV`).

    Raises
    ------
    ValueError
        If the variable does not parse, names a key that is not a market key, or a ``{key}`` the node lacks.
    """
    own = dict(context.node_config)
    text = os.environ.get(NODE_CONFIG_ENV, "").strip()
    if not text:
        return own
    shared: dict[str, Any] = {}
    for key, raw in _parsed_env(text).items():
        if isinstance(raw, str):
            try:
                raw = raw.format_map({name: value for name, value in own.items()})
            except (KeyError, ValueError, IndexError) as err:
                raise ValueError(f"{NODE_CONFIG_ENV} {key}={raw!r}: {err!r} is not in this node's node config") from err
        shared[key] = raw
    return {**shared, **own}


@functools.cache
def _parsed_env(text: str) -> dict[str, Any]:
    """``$FLMARKET_NODE_CONFIG`` parsed (once per text), its keys checked to be market keys."""
    try:
        parsed = dict(parse_config_args([text]))
    except (ValueError, TypeError) as err:
        raise ValueError(f"{NODE_CONFIG_ENV} does not parse as a node config: {err}") from err
    known = {key.name for key in MARKET_NODE_KEYS}
    unknown = sorted(set(parsed) - known)
    if unknown:
        raise ValueError(f"{NODE_CONFIG_ENV} names {unknown}, which are not market node-config keys")
    return parsed


def _run_directory(
    context: Context, pinned: IdentityDirectory | None, member: int
) -> tuple[IdentityDirectory | None, IdentityDirectory | None]:
    """``(directory, member directory)`` the node checks this run against: the pinned directory keyed by node id
    as it is; one keyed by member, bound to this run's node ids by the bind step (empty before it).

    Raises
    ------
    ValueError
        If ``identity-member`` is unset for a directory keyed by member, not in it, or set for one keyed by node id.
    """
    if pinned is None or not pinned.by_member:
        if member >= 0:
            raise ValueError("node-config identity-member is set, but the directory lists Flower node ids: refused "
                             "(identity_cli make --members makes a directory keyed by member)")  # fmt: skip
        return pinned, None
    if member < 0:
        raise ValueError("node-config identity-member is needed: the pinned directory is keyed by member (in "
                         "simulation: identity-member={partition-id})")  # fmt: skip
    if member not in pinned:
        raise ValueError(f"node-config identity-member {member} is not a member of the pinned directory")
    record = context.state.get(IDENTITY_STATE_KEY)
    if isinstance(record, ConfigRecord) and record.get("run-id") == int(context.run_id):
        packed, digest = record.get("bindings"), record.get("directory-digest")
        if isinstance(packed, bytes) and digest == pinned.digest():
            return _bound(pinned, packed, int(context.run_id)), pinned
    return IdentityDirectory({}, members=pinned.members), pinned


_BOUND: dict[tuple[bytes, bytes, int], IdentityDirectory] = {}


def _bound(pinned: IdentityDirectory, packed: bytes, run_id: int) -> IdentityDirectory:
    """This run's bindings, checked when first read in this process (then kept by their bytes)."""
    key = (pinned.digest(), hashlib.sha256(packed).digest(), run_id)
    if key not in _BOUND:
        if len(_BOUND) >= 64:
            _BOUND.clear()
        _BOUND[key] = bind_members(pinned, unpack_member_bindings(packed), run_id)
    return _BOUND[key]


def _identity_key(value: _ConfigValues, secure: bool) -> Ed25519PrivateKey | None:
    """The node's Ed25519 identity key, from the PEM file named by ``identity-key`` (``None``: none)."""
    path = value("identity-key")
    if not path:
        if secure:
            _profile_requires("identity-key (identity_cli keygen makes one)")
        return None
    try:
        return _FILES.identity_key(Path(path).expanduser())
    except (OSError, ValueError) as error:
        raise ValueError(f"node-config identity-key: {error}") from error


def _identity_directory(value: _ConfigValues, secure: bool) -> IdentityDirectory | None:
    """The directory of identity keys named by ``identity-directory``, checked against the node's pins.

    The node pins the directory it trusts: ``identity-directory-digest`` (its SHA-256) and/or
    ``identity-directory-signer`` (the key of the third party that signs it). A directory with neither pin is
    refused unless ``identity-directory-unpinned`` is true: the buyer must not be able to write what the node
    trusts. ``None`` without ``identity-directory``.
    """
    path = value("identity-directory")
    digest, signer = value("identity-directory-digest"), value("identity-directory-signer")
    unpinned = bool(value("identity-directory-unpinned"))
    if secure:
        if not path:
            _profile_requires("identity-directory, pinned by identity-directory-digest or -signer")
        if unpinned:
            raise ValueError("node-config identity-directory-unpinned is refused with market-security=malicious: "
                             "pin the directory by identity-directory-digest or -signer")  # fmt: skip
    if not path:
        if digest or signer:
            raise ValueError("node-config identity-directory-digest/-signer pin a directory, but identity-directory "
                             "names none: refused")  # fmt: skip
        return None
    pins = (
        parse_digest(digest, "identity-directory-digest") if digest else None,
        parse_public_key(signer, "identity-directory-signer") if signer else None,
        unpinned,
    )
    try:
        return _FILES.directory(Path(path).expanduser(), *pins)
    except (OSError, ValueError) as error:
        pinned = [name for name, pin in (("identity-directory-digest", digest), ("identity-directory-signer", signer))
                  if pin]  # fmt: skip
        hint = "" if pinned else "; set identity-directory-digest or identity-directory-signer"
        raise ValueError(f"node-config {'/'.join(pinned) or 'identity-directory'}: {error}{hint}") from error


def _buyer_key(value: _ConfigValues) -> bytes | None:
    """The buyer's Ed25519 public key the node pins (``market-buyer-key``, 32 bytes; ``None``: none)."""
    text = value("market-buyer-key")
    return parse_public_key(text, "market-buyer-key") if text else None


def _complete_graph(value: _ConfigValues, secure: bool, is_set: bool) -> bool:
    """``pass-complete-graph``; always on in the secure profile, where an explicit ``false`` is refused."""
    if secure:
        if is_set and not value("pass-complete-graph"):
            raise ValueError("node-config pass-complete-graph=false is refused with market-security=malicious")
        return True
    return bool(value("pass-complete-graph"))


def _sparse_settings(
    value: _ConfigValues, accepts: bool, colluders: int, roster_floor: int
) -> SparseSecureSettings | None:
    """The settings the node holds for the sparse secure mode (``None`` where it refuses the mode: outside the secure
    profile, or with ``pass-complete-graph`` set): its colluders and roster floor, ``pass-dropout``,
    ``pass-reruns`` (``-1``: as many as colluders, the buyer's default re-runs), ``pass-security-bits`` and
    ``pass-markets``."""
    if not accepts:
        return None
    reruns = int(value("pass-reruns"))
    return SparseSecureSettings.of(
        colluders=colluders,
        roster_floor=roster_floor,
        dropout=float(value("pass-dropout")),
        reruns=colluders if reruns < 0 else reruns,
        security_bits=int(value("pass-security-bits")),
        markets=int(value("pass-markets")),
    )


def _min_participants(value: _ConfigValues, secure: bool, is_set: bool, directory_size: int, colluders: int) -> int:
    """The roster floor (``pass-min-participants``; the secure profile: two thirds of the pinned directory).

    The server chooses whom it invites, so the complete graph protects a node only when this is close to the size
    of the federation it expects; seating the node among ``t`` colluders on the complete graph then takes about a
    third of the federation. The floor must leave
    :data:`~flmarket_flwr.pass_protocol.noise.MIN_HONEST_CLIENTS` clients beside the assumed colluders (refused
    naming ``pass-colluders`` otherwise).
    """
    if secure and not is_set:
        floor = profile_roster_floor(directory_size, MIN_PARTICIPANTS)
    else:
        floor = int(value("pass-min-participants"))
    if floor < colluders + MIN_HONEST_CLIENTS:
        raise ValueError(
            f"node-config pass-colluders {colluders} needs rosters of at least {colluders + MIN_HONEST_CLIENTS} "
            f"({MIN_HONEST_CLIENTS} honest clients beside the colluders), but the roster floor "
            f"pass-min-participants is {floor}: raise pass-min-participants or lower pass-colluders"
        )
    return floor


def _privacy_budget(value: _ConfigValues, secure: bool, is_set: bool) -> PrivacyBudget | None:
    """The node's total privacy budget (``pass-dp-total-epsilon`` at ``pass-dp-total-delta``; ``None``: none)."""
    epsilon = SECURE_PROFILE_TOTAL_EPSILON if secure and not is_set else float(value("pass-dp-total-epsilon"))
    return PrivacyBudget(epsilon, float(value("pass-dp-total-delta"))) if epsilon > 0 else None


def _release_ledger(
    value: _ConfigValues, secure: bool, identity_key: Ed25519PrivateKey | None, privacy_budget: PrivacyBudget | None
) -> ReleaseLedger | None:
    """The node's release ledger in ``market-ledger-dir`` (the secure profile: one folder per identity key).

    Off by default: a simulation's nodes are not lasting parties, and the operator of each SuperNode chooses where
    its state lives.
    """
    path = str(value("market-ledger-dir"))
    if not path and secure and identity_key is not None:
        path = str(_profile_ledger_dir(identity_key))
    if not path:
        if privacy_budget is not None:
            raise ValueError("node-config pass-dp-total-epsilon needs market-ledger-dir, where the spends are kept")
        return None
    min_roster_change = int(value("market-min-roster-change"))
    return ReleaseLedger(path, min_roster_change=min_roster_change, privacy_budget=privacy_budget)


def check_noise_ceiling(noise: SkellamNoise | None, ceiling: float) -> SkellamNoise | None:
    """``noise`` (a run's announced setting), unless it is weaker than a node's ``pass-dp-max-epsilon`` needs.

    With a ceiling (``> 0``), the node refuses to mask in a run that announces no noise, a larger epsilon, or less
    noise than its ceiling needs at delta 1e-6 with half the roster honest (a larger delta or honest fraction).

    Raises
    ------
    ValueError
        Naming ``pass-dp-max-epsilon``, if the noise falls short.
    """
    if ceiling > 0:
        floor = SkellamNoise(ceiling)  # the noise the node's ceiling needs: delta 1e-6, half the roster honest
        if (
            noise is None
            or noise.epsilon > ceiling
            or noise.target_variance < floor.target_variance
            or noise.honest_fraction > floor.honest_fraction
        ):
            raise ValueError(f"the run's pass-dp-* noise is below this node's pass-dp-max-epsilon {ceiling}: refused")
    return noise


def _sized_noise(noise: SkellamNoise | None, colluders: int) -> SkellamNoise | None:
    """``noise`` sized for at least ``colluders`` (a run may announce more, never fewer): the honest clients' noise
    alone reaches its epsilon with that many colluders adding none."""
    if noise is not None and noise.colluders < colluders:
        return replace(noise, colluders=colluders)
    return noise


def _profile_ledger_dir(identity_key: Ed25519PrivateKey) -> Path:
    """``$FLMARKET_HOME/ledger/<first 16 hex of SHA-256 of the identity public key>``: one folder per identity."""
    public = identity_key.public_key().public_bytes_raw()
    home = Path(os.environ.get(LEDGER_HOME_ENV, "~/.flmarket")).expanduser()
    return home / "ledger" / hashlib.sha256(public).hexdigest()[:16]


class _KeyFiles:
    """The identity keys and directories this process has read, kept by the SHA-256 of each file's content.

    A file is read (and hashed) at every message, parsed and checked only when its content is new: a changed
    file is read again, an unchanged one costs a read and a hash. :attr:`loads` counts the parses.
    """

    _MAX_ENTRIES = 256

    def __init__(self) -> None:
        self._keys: dict[bytes, Ed25519PrivateKey] = {}
        self._directories: dict[tuple[bytes, bytes | None, bytes | None, bool], IdentityDirectory] = {}
        self.loads = {"identity-key": 0, "identity-directory": 0}

    def identity_key(self, path: Path) -> Ed25519PrivateKey:
        """The Ed25519 private key in the PEM file at ``path``."""
        digest = _content_digest(path)
        key = self._keys.get(digest)
        if key is None:
            key = load_identity_key(path)
            self.loads["identity-key"] += 1
            if _content_digest(path) == digest:  # the file did not change while it was parsed
                self._keep(self._keys, digest, key)
        return key

    def directory(self, path: Path, digest: bytes | None, signer: bytes | None, unpinned: bool) -> IdentityDirectory:
        """The directory at ``path``, checked against the pins (:func:`load_directory`)."""
        cache_key = (_content_digest(path), digest, signer, unpinned)
        directory = self._directories.get(cache_key)
        if directory is None:
            directory = load_directory(path, digest=digest, signer=signer, unpinned=unpinned)
            self.loads["identity-directory"] += 1
            if _content_digest(path) == cache_key[0]:
                self._keep(self._directories, cache_key, directory)
        return directory

    def _keep(self, cache: dict[Any, Any], key: Any, value: Any) -> None:
        if len(cache) >= self._MAX_ENTRIES:
            cache.clear()
        cache[key] = value


def _content_digest(path: Path) -> bytes:
    return hashlib.sha256(path.read_bytes()).digest()


_FILES: Final = _KeyFiles()
"""This process's identity keys and directories (a SuperNode runs one node; a simulation, many)."""


if __name__ == "__main__":
    import sys

    print(MARKET_SCHEMA.markdown() if sys.argv[1:] == ["--markdown"] else MARKET_SCHEMA.table(), end="")
