"""A ``data-root`` that names no folder is an error naming the key, for every data set (digits too)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flmarket_flwr.task import DataConfig


@pytest.mark.parametrize("dataset", ["digits", "cifar10", "cinic10", "deap"])
def test_a_data_root_that_is_no_folder_is_refused_naming_the_key(tmp_path: Path, dataset: str) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(ValueError, match=rf"data-root '{missing}' is not a folder; ") as raised:
        DataConfig.from_run_config({"dataset": dataset, "data-root": str(missing)})
    fix = "leave data-root empty (data-root='')" if dataset == "digits" else f"holds the {dataset} files"
    assert fix in str(raised.value)
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    with pytest.raises(ValueError, match="is not a folder"):
        DataConfig.from_run_config({"dataset": dataset, "data-root": str(a_file)})


def test_digits_without_data_root_and_a_real_folder_are_accepted(tmp_path: Path) -> None:
    assert DataConfig.from_run_config({"dataset": "digits", "data-root": ""}).data_root == ""
    assert DataConfig.from_run_config({"dataset": "cifar10", "data-root": str(tmp_path)}).data_root == str(tmp_path)


def test_digits_xl_data_root_is_a_cache_folder_made_on_first_use(tmp_path: Path) -> None:
    cache = tmp_path / "cache" / "digits_xl"
    assert DataConfig.from_run_config({"dataset": "digits_xl", "data-root": str(cache)}).data_root == str(cache)
