"""The app's one config schema (``flmarket_flwr/app/run_config.py``), the experiments' extension of it
(``simulations/run_config.py``), and everything that reads them.

``[tool.flwr.app.config]`` in ``pyproject.toml`` is what ``flwr run .`` uses: it must be the app schema's table,
verbatim. Hydra's ``conf/`` reads the experiments' schema as a structured config: the default composition maps to
exactly its defaults, a wrong type fails at composition, and every group option composes into a valid job run
config whose app keys the ServerApp takes. The ServerApp, the data config and the engine take their defaults and
checks from the schemas.
"""

from dataclasses import fields
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig
from omegaconf.errors import MissingMandatoryValue

from flmarket_flwr.app.run_config import APP_KEYS, APP_SCHEMA, DEFAULTS, check_run_config, pyproject_table
from flmarket_flwr.app.server_app import ServerSettings
from flmarket_flwr.app.task import DataConfig
from simulations.apps import strategy_of
from simulations.config import CONF_DIR, GROUP_KEYS, app_config_defaults, to_run_config
from simulations.progress import count_jobs, format_line
from simulations.record import SELECTOR_LABELS
from simulations.run_config import EXPERIMENT_KEYS, EXPERIMENT_SCHEMA, ExperimentSettings, split_run_config

GROUPS = ("dataset", "model", "distribution", "selector", "federation", "training", "engine")
NEEDS_ROOT = {"cifar10", "cinic10", "deap"}


def compose_config(*overrides: str) -> DictConfig:
    """``conf/config.yaml`` composed with ``overrides`` (as on the command line)."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def options(group: str) -> list[str]:
    """The options of a config group (its YAML files)."""
    return sorted(path.stem for path in (Path(CONF_DIR) / group).glob("*.yaml"))


def test_pyproject_holds_the_schema_table_verbatim() -> None:
    """``python -m flmarket_flwr.app.run_config`` prints pyproject's table: keys, values, types and comments."""
    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text(encoding="utf-8")
    assert pyproject_table() in text, "regenerate [tool.flwr.app.config] with `python -m flmarket_flwr.app.run_config`"
    assert app_config_defaults() == DEFAULTS
    assert all(type(app_config_defaults()[key]) is type(value) for key, value in DEFAULTS.items())


def test_defaults_equal_the_schema() -> None:
    """The default composition maps to the experiments' schema's defaults: same keys, values and types; its app
    part is exactly the app's defaults."""
    run_config = to_run_config(compose_config())
    assert run_config == EXPERIMENT_SCHEMA.defaults
    assert all(type(run_config[key]) is type(value) for key, value in EXPERIMENT_SCHEMA.defaults.items())
    app, own = split_run_config(run_config)
    assert app == DEFAULTS and own == ExperimentSettings() and (own.selector, own.val_per_class) == ("flmarket", 0)


def test_the_app_schema_has_no_experiment_key() -> None:
    """``selector`` and ``val-per-class`` are the experiments' keys: the app's schema, its pyproject table and its
    boundaries have neither, and the app refuses each as an unknown key, naming it."""
    own = [key.name for key in EXPERIMENT_KEYS]
    assert own == ["val-per-class", "selector"]
    assert not set(own) & set(DEFAULTS) and not set(own) & set(app_config_defaults())
    assert EXPERIMENT_SCHEMA.keys == (*APP_KEYS, *EXPERIMENT_KEYS)
    for name, value in (("selector", "rs"), ("val-per-class", 10)):
        with pytest.raises(ValueError, match=rf"unknown run-config key\(s\) \['{name}'\]"):
            check_run_config({name: value})
        with pytest.raises(ValueError, match=name):
            ServerSettings.from_run_config({name: value})
        assert not hasattr(ServerSettings(), name.replace("-", "_"))


def test_the_experiments_keys_are_checked_by_the_same_checker() -> None:
    """A bad value of an experiments' key is refused naming it; an unknown key names the experiments' listing."""
    for name, bad in (("selector", "nope"), ("val-per-class", -1)):
        with pytest.raises(ValueError, match=f"run-config key {name}="):
            EXPERIMENT_SCHEMA.check_run_config({name: bad})
        with pytest.raises(ValueError, match=f"run-config key {name}="):
            split_run_config({name: bad})
        with pytest.raises(ValueError, match=f"run-config key {name}="):
            ExperimentSettings(**{name.replace("-", "_"): bad})
    with pytest.raises(ValueError, match="python -m simulations.run_config lists every key"):
        EXPERIMENT_SCHEMA.check_run_config({"selectr": "rs"})
    with pytest.raises(ValueError, match="declared twice"):
        APP_SCHEMA.extended([APP_KEYS[0]], "x")


def test_code_defaults_are_the_schema_defaults() -> None:
    """ServerSettings and DataConfig take their defaults from the schema (DataConfig's num_clients and
    val_per_class are no app key)."""
    for obj in (ServerSettings(), DataConfig()):
        for field in fields(obj):
            if field.name not in ("num_clients", "val_per_class"):
                assert getattr(obj, field.name) == DEFAULTS[field.name.replace("_", "-")], field.name
    assert ServerSettings.from_run_config({}) == ServerSettings()
    assert DataConfig.from_run_config({}) == DataConfig()


BAD_VALUES = {
    "dataset": "mnist",
    "distribution": "d9",
    "schedule": "cubic",
    "alpha": 0.0,
    "test-per-class": 0,
    "seed": -1,
    "budget": -5.0,
    "num-selected": -1,
    "auction-budget-rule": "most",
    "cost-low": 0.0,
    "cost-high": -1.0,
    "bid-markup": -0.1,
    "market-timeout": 0.0,
    "market-timeout-per-node": -1.0,
    "market-min-participation": 0.0,
    "market-security": "paranoid",
    "market-include": "12; 13",
    "market-include-payment": -1.0,
    "market-exclude": "node-7",
    "market-relaunch-every": -1,
    "market-relaunch-churn": -0.5,
    "market-relaunch-min-cohort": -2,
    "market-relaunch-share": 1.5,
    "wait-for-nodes-timeout": -1.0,
    "min-market-clients": 2,
    "neighbours": "1",
    "pass-reruns": "-1",
    "pass-colluders": "many",
    "model": "vgg",
    "num-server-rounds": 0,
    "fraction-train": 0.0,
    "fraction-evaluate": 1.5,
    "local-epochs": 0,
    "batch-size": 0,
    "learning-rate": 0.0,
    "momentum": 1.0,
    "round-timeout": 0.0,
    "device": "gpu",
    "torch-threads": -1,
    "pass-dp-epsilon": -1.0,
    "pass-dp-delta": 1.0,
    "pass-dp-honest-fraction": 0.0,
}


def test_every_checked_key_has_a_refused_value() -> None:
    """Each key with a check refuses a bad value where the ServerApp reads it, naming the key."""
    checked = {key.name for key in APP_KEYS if key.check is not None}
    assert checked == set(BAD_VALUES)
    for name, bad in BAD_VALUES.items():
        with pytest.raises(ValueError, match=f"run-config key {name}="):
            check_run_config({name: bad})
        with pytest.raises(ValueError, match=name):
            ServerSettings.from_run_config({name: bad})
    with pytest.raises(ValueError, match="cost-low/cost-high"):
        check_run_config({"cost-low": 2.0, "cost-high": 1.0})
    with pytest.raises(ValueError, match="budget='600'"):
        check_run_config({"budget": "600"})
    with pytest.raises(ValueError, match="unknown run-config key"):
        check_run_config({"budjet": 600.0})


@pytest.mark.parametrize(
    ("override", "key"),
    [("budget=cheap", "budget"), ("num_selected=2.5", "num_selected"), ("audit_winners=maybe", "audit_winners")],
)
def test_a_wrong_type_fails_at_composition(override: str, key: str) -> None:
    """Hydra reads the schema's types: a wrong type stops the job before it starts."""
    with pytest.raises(ConfigCompositionException, match=key):
        compose_config(override)


def test_group_keys_map_to_app_keys() -> None:
    """Every group key has a run-config key, and the default groups are the documented ones."""
    assert set(GROUP_KEYS.values()) <= set(EXPERIMENT_SCHEMA.defaults)
    cfg = compose_config()
    assert cfg.dataset.name == "digits" and cfg.model.name == "digits_cnn"
    assert cfg.federation.num_clients == 20 and cfg.selector.name == "flmarket"


@pytest.mark.parametrize("group", GROUPS)
def test_every_group_option_composes(group: str) -> None:
    """Each option of each group composes into a complete, valid job run config, its app part the app's keys."""
    found = options(group)
    assert found, f"conf/{group}/ has no options"
    for option in found:
        extra = [f"dataset.root=/data/{option}"] if group == "dataset" and option in NEEDS_ROOT else []
        run_config = to_run_config(compose_config(f"{group}={option}", *extra))
        assert set(run_config) == set(EXPERIMENT_SCHEMA.defaults)
        app, own = split_run_config(run_config)
        assert set(app) == set(app_config_defaults())
        ServerSettings.from_run_config({**app, "num-selected": 5})
        strategy_of(own.selector, 5)
        if group == "dataset":
            assert run_config["dataset"] == option
        elif group == "model":
            assert run_config["model"] == option
        elif group == "distribution":
            assert run_config["distribution"] == option
        elif group == "selector":
            assert run_config["selector"] == option
        DataConfig.from_run_config(app, val_per_class=own.val_per_class)


def test_expected_group_options() -> None:
    """The groups offer what the experiments need."""
    assert options("dataset") == [
        "cifar10",
        "cinic10",
        "deap",
        "digits",
        "digits_xl",
        "digits_xl_rgb32",
        "fashion_mnist",
    ]
    assert options("model") == ["deap_cnn", "digits_cnn", "fmnist_cnn", "resnet56"]
    assert options("distribution") == [f"d{i}" for i in range(1, 8)]
    assert sorted(options("selector")) == sorted(SELECTOR_LABELS)
    assert options("federation") == ["c100", "c20"]
    assert compose_config("federation=c100").federation.num_clients == 100


def test_dataset_options_pick_their_model() -> None:
    """CIFAR-10 and CINIC-10 train ResNet-56, DEAP its 1-D CNN, Fashion-MNIST its CNN; the command line wins."""
    assert compose_config("dataset=cifar10", "dataset.root=/x").model.name == "resnet56"
    assert compose_config("dataset=cinic10", "dataset.root=/x").model.name == "resnet56"
    assert compose_config("dataset=deap", "dataset.root=/x").model.name == "deap_cnn"
    assert compose_config("dataset=digits_xl_rgb32").model.name == "resnet56"
    fashion = to_run_config(compose_config("dataset=fashion_mnist"))  # no root needed: Debian's folder
    assert (fashion["dataset"], fashion["data-root"], fashion["model"]) == ("fashion_mnist", "", "fmnist_cnn")
    assert compose_config("dataset=cifar10", "dataset.root=/x", "model=digits_cnn").model.name == "digits_cnn"


def test_local_datasets_need_a_root() -> None:
    """A data set read from disk without dataset.root is a clear error, not a silent default."""
    with pytest.raises(MissingMandatoryValue):
        to_run_config(compose_config("dataset=cifar10"))


def test_sfedavg_gets_a_validation_split() -> None:
    """selector=sfedavg sets dataset.val_per_class (S-FedAvg needs it); the command line wins; no dataset option
    restates its default (the schema's, through the structured config)."""
    assert not [path.name for path in (CONF_DIR / "dataset").glob("*.yaml") if "val_per_class" in path.read_text()]
    assert compose_config("selector=sfedavg").dataset.val_per_class == 10
    assert compose_config("selector=sfedavg", "dataset.val_per_class=20").dataset.val_per_class == 20
    assert compose_config("selector=rs").dataset.val_per_class == 0


def test_digits_sweep_training_preset() -> None:
    """training=digits_sweep changes training keys only, and they are app keys."""
    base = to_run_config(compose_config())
    sweep = to_run_config(compose_config("training=digits_sweep"))
    changed = {key for key in base if base[key] != sweep[key]}
    assert changed and changed <= {"num-server-rounds", "local-epochs", "batch-size", "learning-rate", "momentum"}


def test_command_line_values_take_the_app_types() -> None:
    """``budget=700`` (an int on Hydra's command line) reaches the app as 700.0."""
    run_config = to_run_config(compose_config("budget=700", "num_selected=5", "run_name=7"))
    assert run_config["budget"] == 700.0 and isinstance(run_config["budget"], float)
    assert run_config["num-selected"] == 5 and run_config["run-name"] == "7"


def test_unknown_top_level_key_is_rejected() -> None:
    """A typo at the top level is an error (runner settings live under ``sim``)."""
    with pytest.raises(KeyError, match="not a run-config key"):
        to_run_config(compose_config("+num_selectd=5"))


def test_progress_counts_and_formats() -> None:
    """The progress display counts the jobs of a sweep like Hydra's basic sweeper."""
    assert count_jobs(["a=1,2", "b=x,y,z", "c=5"]) == 6
    assert (
        count_jobs(
            [
                "distribution=d1,d2,d3,d4,d5,d6",
                "selector=flmarket,rs,qbs,dice,dds",
                "num_selected=5,10,15",
                "seed=0,1,2",
            ]
        )
        == 270
    )
    line = format_line(index=3, total=10, elapsed_s=30.0, overrides="a=1", accuracy=0.91234, job_s=9.5)
    assert line.startswith("[ 3/10] 0:00:30 elapsed, ETA 0:01:10 | a=1 | acc 0.9123 | 9.5 s")
    failed = format_line(index=1, total=1, elapsed_s=1, overrides="", accuracy=None, job_s=1, failed="boom")
    assert "FAILED (boom)" in failed
