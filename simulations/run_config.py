"""The experiments' run-config schema: the app's keys plus the experiments' own, checked by the app's checker.

``selector`` and ``val-per-class`` are not keys of the product app (it runs FLMarket on the whole training pool);
the experiments' jobs carry them (Hydra's ``conf/``, the engine, ``simulations.run``, the records), and
:func:`split_run_config` hands the app its own keys and the experiments' runner the rest.
``python -m simulations.run_config`` prints the experiments' own keys (``python -m flmarket_flwr.app.run_config``
the app's); ``--python`` the source of :mod:`simulations.settings_fields`, the experiments' generated settings
classes (:data:`EXPERIMENT_SETTINGS_FIELDS`), which a test holds equal to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from flmarket_flwr.app.run_config import APP_SCHEMA, AppKey, RunConfigSchema, Scalar, SettingsFields
from flmarket_flwr.market.wire.config_keys import at_least, one_of
from simulations.record import SELECTOR_LABELS
from simulations.settings_fields import ExperimentFields

__all__ = [
    "ENGINE_APP_KEYS",
    "EXPERIMENT_KEYS",
    "EXPERIMENT_SCHEMA",
    "EXPERIMENT_SETTINGS_FIELDS",
    "ROUNDS_KEY",
    "SWEEP_DEFAULTS",
    "ExperimentSettings",
    "markdown_table",
    "python_source",
    "split_run_config",
]

EXPERIMENT_KEYS: Final[tuple[AppKey, ...]] = (
    AppKey("val-per-class", 0, "server-side validation split from the training set (S-FedAvg needs > 0; the runs "
           "compared with it take the same)", "data", at_least(0), ">= 0"),
    AppKey("selector", "flmarket", "flmarket (the app's market), or a baseline: rs, qbs, dice, dds, sfedavg",
           "server", one_of(SELECTOR_LABELS), f"one of {list(SELECTOR_LABELS)}"),
)  # fmt: skip
"""The experiments' own run-config keys (not the app's), after the app's in :data:`EXPERIMENT_SCHEMA`."""

EXPERIMENT_SCHEMA: Final[RunConfigSchema] = APP_SCHEMA.extended(EXPERIMENT_KEYS, "python -m simulations.run_config")
"""The run config of an experiment job: the app's keys, then :data:`EXPERIMENT_KEYS`."""


ENGINE_APP_KEYS: Final = (
    "dataset",
    "data-root",
    "test-per-class",
    "val-per-class",
    "model",
    "distribution",
    "schedule",
    "alpha",
    "seed",
    "selector",
    "num-selected",
    "budget",
    "auction-budget-rule",
    "neighbours",
    "audit-winners",
    "cost-low",
    "cost-high",
    "bid-markup",
    "local-epochs",
    "batch-size",
    "learning-rate",
    "momentum",
    "device",
    "torch-threads",
)
"""The run-config keys (:data:`EXPERIMENT_SCHEMA`) the engine implements (a field each,
:func:`~flmarket_flwr.app.run_config.field_name`), besides ``num-server-rounds``, its
:attr:`~simulations.engine.EngineConfig.rounds`; any other set to a non-default value is refused."""

ROUNDS_KEY: Final = "num-server-rounds"
"""The run-config key of :attr:`~simulations.engine.EngineConfig.rounds`: the field keeps the name ``rounds``
because the archived records (``engine.config``), ``python -m simulations.engine --rounds`` and the sweep scripts
use it."""

SWEEP_DEFAULTS: Final[dict[str, Scalar]] = {
    "dataset": "digits_xl",
    "test-per-class": 50,
    "num-selected": 10,
    "num-server-rounds": 60,
    "local-epochs": 1,
    "batch-size": 32,
    "learning-rate": 0.05,
    "momentum": 0.9,
    "device": "cpu",
}
"""The keys whose :class:`~simulations.engine.EngineConfig` default differs from the schema's
(:data:`EXPERIMENT_SCHEMA`): the profile of ``python -m simulations.engine``'s grids, the sweeps' protocol
(digits_xl, a cohort of 10, fixed local steps at batch 32 until the plateau, on the CPU), on which the archived
grids set their data set, cohort and rounds by flag. Hydra's ``engine=inprocess`` starts from the schema's defaults
instead, and sets its own training keys in ``conf/engine/inprocess.yaml``."""

EXPERIMENT_SETTINGS_FIELDS: Final = (
    SettingsFields(
        "ExperimentFields", tuple(key.name for key in EXPERIMENT_KEYS), "The experiments' own keys of a job."
    ),
    SettingsFields(
        "EngineFields",
        ENGINE_APP_KEYS,
        "The run-config keys of an in-process job of the engine, at the sweeps' profile (SWEEP_DEFAULTS).",
        overrides={key: value for key, value in SWEEP_DEFAULTS.items() if key in ENGINE_APP_KEYS},
    ),
)
"""The experiments' generated settings classes, in :mod:`simulations.settings_fields`."""


class ExperimentSettings(ExperimentFields):
    """The experiments' own keys of a job, typed and checked: a field per key of :data:`EXPERIMENT_KEYS`
    (``val_per_class``, ``selector``), with the schema's defaults."""

    def check(self) -> None:
        """Raise ``ValueError`` naming the key whose value its check refuses (run at construction)."""
        EXPERIMENT_SCHEMA.check_values({key.name: getattr(self, key.field) for key in EXPERIMENT_KEYS})


def split_run_config(run_config: Mapping[str, Any]) -> tuple[dict[str, Any], ExperimentSettings]:
    """``(the app's run config, the experiments' settings)`` of an experiment job's run config.

    Parameters
    ----------
    run_config : Mapping[str, Any]
        Keys of :data:`EXPERIMENT_SCHEMA` (``-`` style); the experiments' keys may be absent.

    Returns
    -------
    tuple
        The app's keys as given, and :class:`ExperimentSettings` (an absent key at its default).

    Raises
    ------
    ValueError
        For a value of an experiments' key of the wrong type or that its check refuses, naming the key.
    """
    own = {key.name for key in EXPERIMENT_KEYS}
    app = {name: value for name, value in run_config.items() if name not in own}
    return app, EXPERIMENT_SCHEMA.settings_from(ExperimentSettings, run_config)


def markdown_table() -> str:
    """The experiments' own keys as a Markdown table (``docs/configuration.md`` holds it; a test keeps it equal)."""
    return RunConfigSchema(EXPERIMENT_KEYS, EXPERIMENT_SCHEMA.command).markdown_table()


def python_source() -> str:
    """The source of :mod:`simulations.settings_fields` (``python -m simulations.run_config --python``)."""
    return EXPERIMENT_SCHEMA.python_source(EXPERIMENT_SETTINGS_FIELDS, "python -m simulations.run_config --python")


if __name__ == "__main__":
    import sys

    print(python_source() if sys.argv[1:] == ["--python"] else markdown_table(), end="")
