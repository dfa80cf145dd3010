"""The experiments' run-config schema: the app's keys plus the experiments' own, checked by the app's checker.

``selector`` and ``val-per-class`` are not keys of the product app (it runs FLMarket on the whole training pool);
the experiments' jobs carry them (Hydra's ``conf/``, the engine, ``simulations.run``, the records), and
:func:`split_run_config` hands the app its own keys and the experiments' runner the rest.
``python -m simulations.run_config`` prints the experiments' own keys (``python -m flmarket_flwr.app.run_config``
the app's).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from flmarket_flwr.app.run_config import APP_SCHEMA, AppKey, RunConfigSchema
from flmarket_flwr.market.config_keys import at_least, one_of
from simulations.record import SELECTOR_LABELS

__all__ = ["EXPERIMENT_KEYS", "EXPERIMENT_SCHEMA", "ExperimentSettings", "markdown_table", "split_run_config"]

EXPERIMENT_KEYS: Final[tuple[AppKey, ...]] = (
    AppKey("val-per-class", 0, "server-side validation split from the training set (S-FedAvg needs > 0; the runs "
           "compared with it take the same)", "data", at_least(0), ">= 0"),
    AppKey("selector", "flmarket", "flmarket (the app's market), or a baseline: rs, qbs, dice, dds, sfedavg",
           "server", one_of(SELECTOR_LABELS), f"one of {list(SELECTOR_LABELS)}"),
)  # fmt: skip
"""The experiments' own run-config keys (not the app's), after the app's in :data:`EXPERIMENT_SCHEMA`."""

EXPERIMENT_SCHEMA: Final[RunConfigSchema] = APP_SCHEMA.extended(EXPERIMENT_KEYS, "python -m simulations.run_config")
"""The run config of an experiment job: the app's keys, then :data:`EXPERIMENT_KEYS`."""


_ExperimentFields: Any = EXPERIMENT_SCHEMA.schema_class("ExperimentSettings", [key.name for key in EXPERIMENT_KEYS])


class ExperimentSettings(_ExperimentFields):
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


if __name__ == "__main__":
    print(markdown_table(), end="")
