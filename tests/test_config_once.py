"""Each run-config key is named once: in the schema (``run_config.APP_KEYS``) and the pyproject table it prints,
or, for the experiments' own keys (``selector``, ``val-per-class``), in their extension of it
(``simulations.run_config.EXPERIMENT_KEYS``), which the product app neither declares nor reads.

The boundaries' settings (ServerApp, ClientApp, data config, train message, engine job) subclass classes whose
source is generated from the schema and checked in, held equal to it here, so ``mypy`` sees every field and a renamed
key fails the type check; the plugin's own defaults (``MarketConfig``, ``SimulatedCostBid``) are the schema's for the
keys that set them; the ServerApp waits for nodes once; ``FLMarket`` takes a ``MarketConfig`` or the drop-in's
shorthand.
"""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict
from flwr.serverapp.strategy import FedAvg
from hypothesis import given
from hypothesis import strategies as st
from mypy import api as mypy_api

from flmarket_flwr.app import client_app, server_app
from flmarket_flwr.app import run_config as app_run_config
from flmarket_flwr.app.run_config import (
    APP_KEYS,
    APP_SCHEMA,
    DEFAULTS,
    TRAIN_MESSAGE_KEYS,
    RunConfigSchema,
    SettingsFields,
    default,
    field_name,
    keys_read_by,
    settings_from,
    train_message_config,
)
from flmarket_flwr.app.task import DataConfig
from flmarket_flwr.market import FLMarket, MarketConfig, MarketError, SimulatedCostBid
from flmarket_flwr.market.buyer import server as market_server
from simulations import run_config as experiments_run_config
from simulations.engine import ENGINE_APP_KEYS, ROUNDS_KEY, SWEEP_DEFAULTS, EngineConfig
from simulations.inprocess_grid import InProcessGrid
from simulations.run_config import EXPERIMENT_KEYS, EXPERIMENT_SCHEMA, ExperimentSettings

PROJECT = Path(__file__).resolve().parents[1]
PACKAGE = PROJECT / "flmarket_flwr"
SCHEMA_MODULE = PACKAGE / "app" / "run_config.py"
NODE_SCHEMA_MODULE = PACKAGE / "market" / "node" / "node_config.py"
PLUGIN_SOURCES = {"MarketConfig", "SimulatedCostBid"}
"""The plugin's classes whose field defaults the schema reads (a key's one default lives there)."""
GENERATED = {
    PACKAGE / "app" / "settings_fields.py": app_run_config.python_source,
    PROJECT / "simulations" / "settings_fields.py": experiments_run_config.python_source,
}
"""Each module generated from a schema, and the function that prints its source."""
OWN_FIELDS = {"DataConfig.val_per_class"}
"""Fields named like a key that are a boundary's own: the data config's validation split (``0`` in the app, which
has no ``val-per-class`` key; the experiments set it from theirs)."""


def _python_files(*roots: Path) -> list[Path]:
    return sorted(path for root in roots for path in root.rglob("*.py"))


def test_no_module_of_the_package_names_a_run_config_key_outside_the_schema() -> None:
    """A multi-word key as a string literal anywhere in ``flmarket_flwr`` but ``run_config.py`` is a restatement.

    The node-config schema may name its own keys that share a run-config key's name (each node sets them).
    """
    keys = {key.name for key in (*APP_KEYS, *EXPERIMENT_KEYS) if "-" in key.name}
    node_keys = {key.name for key in client_app.NODE_CONFIG.keys}
    found = []
    for path in _python_files(PACKAGE):
        if path == SCHEMA_MODULE:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in keys:
                if path == NODE_SCHEMA_MODULE and node.value in node_keys:
                    continue
                found.append(f"{path.relative_to(PROJECT)}:{node.lineno} {node.value!r}")
    assert not found, f"run-config keys restated outside run_config.py: {found}"


def _restates(value: ast.expr | None, field: str, default_value: object) -> bool:
    """Whether a field's default writes the key's default out again, or looks the key up by name
    (``default_as("budget", float)``)."""
    if isinstance(value, ast.Constant):
        return bool(value.value == default_value)
    names = {field, field.replace("_", "-")}
    return isinstance(value, ast.Call) and any(
        isinstance(arg, ast.Constant) and arg.value in names for arg in value.args
    )


def test_no_class_restates_a_key_as_a_field_with_its_own_default() -> None:
    """A class field named after a key, its default the key's written out again, is a second source of it
    (but in the plugin's classes the schema reads its defaults from); the experiments' keys too."""
    fields = {key.field: key.default for key in EXPERIMENT_SCHEMA.keys}
    found = []
    for path in _python_files(PACKAGE, PROJECT / "simulations", PROJECT / "benchmarks"):
        if path in GENERATED:  # printed from the schema, and held equal to it below
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef) or node.name in PLUGIN_SOURCES:
                continue
            for statement in node.body:
                if (
                    isinstance(statement, ast.AnnAssign)
                    and isinstance(statement.target, ast.Name)
                    and statement.target.id in fields
                    and f"{node.name}.{statement.target.id}" not in OWN_FIELDS
                    and _restates(statement.value, statement.target.id, fields[statement.target.id])
                ):
                    found.append(f"{path.relative_to(PROJECT)}:{statement.lineno} {node.name}.{statement.target.id}")
    assert not found, f"fields restating a run-config key's default: {found}"


def test_the_plugin_and_the_app_share_each_default() -> None:
    """One default per setting: the market's keys are MarketConfig's defaults, the bid keys SimulatedCostBid's."""
    market = MarketConfig(budget=1.0, num_classes=1)
    assert market.wait_for_nodes_timeout == default("wait-for-nodes-timeout") == 120.0
    assert (market.timeout, market.timeout_per_node, market.min_participation) == (
        default("market-timeout"),
        default("market-timeout-per-node"),
        default("market-min-participation"),
    )
    assert (market.min_clients, market.neighbours, market.audit_winners, market.security) == (
        default("min-market-clients"),
        default("neighbours"),
        default("audit-winners"),
        default("market-security"),
    )
    bid = SimulatedCostBid()
    assert (bid.low, bid.high, bid.markup) == (default("cost-low"), default("cost-high"), default("bid-markup"))


@pytest.mark.parametrize(
    ("settings", "keys", "own"),
    [
        (server_app.ServerSettings, keys_read_by("data", "server", "both"), ()),
        (client_app.ClientSettings, keys_read_by("data", "client", "both"), ()),
        (client_app.TrainSettings, TRAIN_MESSAGE_KEYS, ()),
        (DataConfig, keys_read_by("data"), ("num_clients", "val_per_class")),
        (EngineConfig, ENGINE_APP_KEYS, None),
        (ExperimentSettings, tuple(key.name for key in EXPERIMENT_KEYS), ()),
    ],
    ids=["server", "client", "train message", "data", "engine", "experiments"],
)
def test_each_boundary_has_a_field_per_schema_key_with_its_default(settings: type, keys: tuple, own: tuple) -> None:
    """The fields are the keys' Python names, typed (as a type checker reads them too) and defaulted by the schema,
    then the boundary's own; the settings are frozen."""
    names = [item.name for item in dataclasses.fields(settings)]
    assert names[: len(keys)] == [field_name(key) for key in keys]
    if own is not None:
        assert names[len(keys) :] == list(own)
    instance = settings()
    annotations = typing.get_type_hints(settings)
    defaults = EXPERIMENT_SCHEMA.defaults  # the app's, and the engine's selector and val-per-class
    for key in keys:
        if settings is not EngineConfig:  # the engine's sweep profile differs on purpose (SWEEP_DEFAULTS)
            assert getattr(instance, field_name(key)) == defaults[key], key
        assert type(getattr(instance, field_name(key))) is type(defaults[key]) is annotations[field_name(key)], key
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(instance, names[0], getattr(instance, names[0]))


@pytest.mark.parametrize("path", sorted(GENERATED), ids=lambda path: str(path.relative_to(PROJECT)))
def test_each_generated_settings_module_is_what_its_schema_prints(path: Path) -> None:
    """The checked-in source of the settings classes is the schema's: a key added, renamed, retyped or given another
    default in the schema fails here until the module is printed again (the command is in its first line)."""
    command = path.read_text(encoding="utf-8").split("``")[1]
    assert path.read_text(encoding="utf-8") == GENERATED[path](), f"stale: run {command} > {path.relative_to(PROJECT)}"


def test_each_key_is_declared_once_and_the_app_declares_no_experiment_key() -> None:
    """The experiments' schema is the app's keys then their own, each name once; ``selector`` and ``val-per-class``
    are the experiments' only: no product boundary has a field for them but the data config's own split."""
    names = [key.name for key in EXPERIMENT_SCHEMA.keys]
    assert len(names) == len(set(names)) and EXPERIMENT_SCHEMA.keys[: len(APP_KEYS)] == APP_KEYS
    assert {key.name for key in EXPERIMENT_KEYS} == {"selector", "val-per-class"}
    assert not {key.name for key in EXPERIMENT_KEYS} & set(DEFAULTS)
    for settings in (server_app.ServerSettings, client_app.ClientSettings, client_app.TrainSettings):
        assert not {"selector", "val_per_class"} & {item.name for item in dataclasses.fields(settings)}


def test_the_sweep_profile_names_only_engine_keys_and_only_where_it_differs() -> None:
    """``SWEEP_DEFAULTS`` is a profile, not a copy: each of its keys is one the engine implements (or its
    ``rounds``), and each value differs from the schema's default (an equal one would restate it)."""
    assert set(SWEEP_DEFAULTS) <= {*ENGINE_APP_KEYS, ROUNDS_KEY}
    for key, value in SWEEP_DEFAULTS.items():
        assert value != EXPERIMENT_SCHEMA.default(key), key
    assert EngineConfig().rounds == SWEEP_DEFAULTS[ROUNDS_KEY]


@given(
    budget=st.integers(1, 10_000) | st.floats(1.0, 1e4),
    epochs=st.integers(1, 50),
    overridden=st.sampled_from(sorted(DEFAULTS)),
)
def test_settings_from_types_the_given_keys_and_defaults_the_rest(budget: float, epochs: int, overridden: str) -> None:
    """An int for a float key becomes a float; absent keys take the schema's default; other keys are ignored."""
    config = {"budget": budget, "local-epochs": epochs, "not-a-key": 1}
    settings = settings_from(server_app.ServerSettings, config)
    assert settings.budget == float(budget) and isinstance(settings.budget, float)
    assert settings.local_epochs == epochs
    if overridden not in config and hasattr(settings, field_name(overridden)):
        assert getattr(settings, field_name(overridden)) == DEFAULTS[overridden]


def test_a_wrongly_typed_value_is_refused_naming_the_key() -> None:
    with pytest.raises(ValueError, match="num-selected"):
        settings_from(server_app.ServerSettings, {"num-selected": "three"})
    with pytest.raises(ValueError, match="num-selected"):
        APP_SCHEMA.python_source([SettingsFields("Profile", ("num-selected",), "-", {"num-selected": "three"})], "-")


def _generated(schema: RunConfigSchema, spec: SettingsFields) -> type:
    namespace: dict[str, object] = {}
    exec(schema.python_source([spec], "test"), namespace)  # pylint: disable=exec-used
    made = namespace[spec.name]
    assert isinstance(made, type)
    return made


def test_a_key_added_to_the_schema_reaches_every_boundary_reading_it() -> None:
    """The fields follow the schema: a class printed from a set of keys has exactly those fields, nothing else."""
    made = _generated(APP_SCHEMA, SettingsFields("Made", ("budget", "momentum", "run-name"), "Made.", {"budget": 2}))
    assert [item.name for item in dataclasses.fields(made)] == ["budget", "momentum", "run_name"]
    assert made() == made(budget=2.0, momentum=DEFAULTS["momentum"], run_name="")
    with pytest.raises(dataclasses.FrozenInstanceError):
        made().budget = 1.0


def test_mypy_catches_a_key_renamed_in_the_schema(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Code that reads ``local_epochs`` type-checks against the schema's classes, and fails ``mypy`` once the key
    is renamed in the schema and the classes printed again (no run needed)."""
    reader = "from fields import TrainFields\n\nepochs: int = TrainFields().local_epochs\n"
    (tmp_path / "reader.py").write_text(reader, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    renamed = [dataclasses.replace(key, name="local-rounds") if key.name == "local-epochs" else key for key in APP_KEYS]
    reports = []
    for schema, keys in ((APP_SCHEMA, TRAIN_MESSAGE_KEYS), (RunConfigSchema(renamed, "-"), ("local-rounds",))):
        source = schema.python_source([SettingsFields("TrainFields", keys, "Train.")], "test")
        (tmp_path / "fields.py").write_text(source, encoding="utf-8")
        report, _, status = mypy_api.run(["--no-incremental", "--cache-dir", str(tmp_path / ".mypy"), "reader.py"])
        reports.append((status, report))
    assert reports[0][0] == 0, reports[0][1]
    assert reports[1][0] == 1 and '"TrainFields" has no attribute "local_epochs"' in reports[1][1], reports[1][1]


def test_the_train_message_carries_the_servers_training_keys() -> None:
    """The ServerApp's train config is :data:`TRAIN_MESSAGE_KEYS` of its settings; the client reads it back."""
    settings = server_app.ServerSettings.from_run_config({"local-epochs": 2, "learning-rate": 0.3})
    message = train_message_config(settings)
    assert set(message) == set(TRAIN_MESSAGE_KEYS)
    back = settings_from(client_app.TrainSettings, {"batch-size": 99, **message})
    assert (back.local_epochs, back.learning_rate, back.batch_size) == (2, 0.3, DEFAULTS["batch-size"])


def test_the_server_app_waits_for_the_nodes_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No probe before the market: the one wait is the market's, and its error names the fix."""
    calls = []
    real = market_server.wait_for_nodes

    def counting(*args: object, **kwargs: object) -> list[int]:
        calls.append(args)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(market_server, "wait_for_nodes", counting)
    run_config = {**DEFAULTS, "num-selected": 5, "results-dir": str(tmp_path), "run-name": "once"}
    grid = InProcessGrid(client_app.app, [11, 22, 33, 44], run_config=run_config)
    with pytest.raises(MarketError, match="only 4 nodes are connected"):
        server_app.main(grid, Context(3, 0, {}, RecordDict(), run_config))
    assert len(calls) == 1


def test_flmarket_takes_a_market_config_or_the_drop_in_shorthand(tmp_path: Path) -> None:
    """``budget``/``num_classes`` (and ``security``/``directory``) build the MarketConfig; no other market knob."""
    shorthand = FLMarket(FedAvg(), budget=600.0, num_classes=10)
    assert shorthand.market_config == MarketConfig(budget=600.0, num_classes=10)
    config = MarketConfig(budget=600.0, num_classes=10, num_winners=3, timeout=5.0)
    assert FLMarket(FedAvg(), market_config=config).market_config is config
    for knob in ("num_winners", "min_clients", "market_timeout", "wait_for_nodes_timeout"):
        with pytest.raises(TypeError, match=knob):
            FLMarket(FedAvg(), budget=600.0, num_classes=10, **{knob: 3})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="either market_config or"):
        FLMarket(FedAvg(), market_config=config, security="malicious")
    with pytest.raises(ValueError, match="needs the directory"):
        FLMarket(FedAvg(), budget=600.0, num_classes=10, security="malicious")
