"""A ``data-root`` that names no folder is an error naming the key when the data is loaded, for every data
set (digits too, which reads none); a config composed on a machine without the data still validates."""

from __future__ import annotations

from pathlib import Path

import pytest

from flmarket_flwr.app import task
from flmarket_flwr.app.task import DataConfig, load_test_set


@pytest.mark.parametrize("dataset", ["digits", "cifar10", "cinic10", "deap"])
def test_a_data_root_that_is_no_folder_is_refused_at_load_naming_the_key(tmp_path: Path, dataset: str) -> None:
    missing = tmp_path / "nowhere"
    config = DataConfig.from_run_config({"dataset": dataset, "data-root": str(missing)})  # the config is fine
    with pytest.raises(ValueError, match=rf"data-root '{missing}' is not a folder; ") as raised:
        load_test_set(config)
    fix = "leave data-root empty (data-root='')" if dataset == "digits" else f"holds the {dataset} files"
    assert fix in str(raised.value)
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    with pytest.raises(ValueError, match="is not a folder"):
        load_test_set(DataConfig.from_run_config({"dataset": dataset, "data-root": str(a_file)}))


def test_digits_without_data_root_loads() -> None:
    images, labels = load_test_set(DataConfig.from_run_config({"dataset": "digits", "data-root": ""}))
    assert len(images) == len(labels) == 300


def test_a_real_folder_and_digits_xl_cache_folder_pass_the_check(tmp_path: Path) -> None:
    task._check_data_root(DataConfig.from_run_config({"dataset": "cifar10", "data-root": str(tmp_path)}))
    cache = tmp_path / "cache" / "digits_xl"  # made on first use
    task._check_data_root(DataConfig.from_run_config({"dataset": "digits_xl", "data-root": str(cache)}))
