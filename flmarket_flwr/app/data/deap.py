"""DEAP peripheral physiological signals from the official preprocessed Python files (nothing is downloaded).

Pass the ``data_preprocessed_python`` folder (``s01.dat`` ... ``s32.dat``, after signing DEAP's licence), or
its parent, as ``root``. :func:`load_deap_windows` cuts the 8 peripheral channels into labelled windows;
:func:`deap_train_test_split` holds out whole trials, so windows of one trial never leak between training
and test. Their docstrings give the channels, windows, standardisation and labels.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flmarket_flwr.app.data._legacy_pickle import load_pickled_dict

__all__ = [
    "DEAP_BASELINE_SECONDS",
    "DEAP_DIRNAME",
    "DEAP_LABEL_MODES",
    "DEAP_NUM_CHANNELS",
    "DEAP_NUM_SUBJECTS",
    "DEAP_SAMPLES_PER_TRIAL",
    "DEAP_SAMPLING_RATE",
    "DEFAULT_DEAP_LABEL",
    "DEFAULT_DEAP_TEST_FRACTION",
    "DEFAULT_WINDOW_SECONDS",
    "HIGH_RATING_THRESHOLD",
    "PERIPHERAL_CHANNELS",
    "PERIPHERAL_CHANNEL_NAMES",
    "QUADRANT_NAMES",
    "RATING_DIMENSIONS",
    "DeapWindows",
    "deap_num_classes",
    "deap_subject_files",
    "deap_train_test_split",
    "load_deap",
    "load_deap_windows",
    "ratings_to_labels",
    "read_deap_subject",
    "resolve_deap_dir",
]

DEAP_DIRNAME: Final[str] = "data_preprocessed_python"
"""Folder name inside the official archive."""

DEAP_NUM_SUBJECTS: Final[int] = 32
"""Participants ``s01`` ... ``s32``."""

DEAP_SAMPLING_RATE: Final[int] = 128
"""Samples per second of the preprocessed signals."""

DEAP_NUM_CHANNELS: Final[int] = 40
"""Channels per trial in the files (32 EEG + 8 peripheral)."""

DEAP_SAMPLES_PER_TRIAL: Final[int] = 8064
"""Samples per trial in the files (63 s)."""

DEAP_BASELINE_SECONDS: Final[int] = 3
"""Pre-trial baseline at the start of each trial, dropped by the loader."""

PERIPHERAL_CHANNELS: Final[tuple[int, ...]] = tuple(range(32, 40))
"""Indices of the peripheral channels in the files' channel axis."""

PERIPHERAL_CHANNEL_NAMES: Final[tuple[str, ...]] = (
    "hEOG",
    "vEOG",
    "zEMG",
    "tEMG",
    "GSR",
    "Respiration belt",
    "Plethysmograph",
    "Temperature",
)
"""Names of the returned channels, in order."""

RATING_DIMENSIONS: Final[tuple[str, ...]] = ("valence", "arousal", "dominance", "liking")
"""Columns of the files' ``labels`` array."""

DEAP_LABEL_MODES: Final[tuple[str, ...]] = (*RATING_DIMENSIONS, "valence_arousal")
"""Accepted ``label`` values: one rating dimension (binary) or the quadrant (4 classes)."""

DEFAULT_DEAP_LABEL: Final[str] = "valence_arousal"
"""Default labels: the four valence x arousal quadrants (several classes, like the images)."""

HIGH_RATING_THRESHOLD: Final[float] = 5.0
"""A rating strictly above this is "high"; at most this is "low"."""

QUADRANT_NAMES: Final[tuple[str, ...]] = ("HVHA", "HVLA", "LVHA", "LVLA")
"""Quaternary class names in label order (High/Low Valence, High/Low Arousal)."""

DEFAULT_WINDOW_SECONDS: Final[float] = 4.0
"""Default window: 4 s = 512 samples, 15 non-overlapping windows per 60 s trial."""

DEFAULT_DEAP_TEST_FRACTION: Final[float] = 0.2
"""Default share of each subject's trials held out for testing (8 of 40)."""

_BASELINE_SAMPLES: Final[int] = DEAP_BASELINE_SECONDS * DEAP_SAMPLING_RATE
_TRIAL_SAMPLES: Final[int] = DEAP_SAMPLES_PER_TRIAL - _BASELINE_SAMPLES
_FILE_PATTERN: Final[re.Pattern[str]] = re.compile(r"s(\d{2})\.dat")
_SPLIT_STREAM: Final[int] = 0x44454150  # "DEAP"
_RATING_RANGE: Final[tuple[float, float]] = (1.0, 9.0)


@dataclass(frozen=True, eq=False)
class DeapWindows:
    """Windows of peripheral signals with their labels and provenance.

    Attributes
    ----------
    signals : numpy.ndarray
        ``float32`` array ``(N, 8, window_samples)``.
    labels : numpy.ndarray
        ``int64`` array ``(N,)``, values ``0 .. num_classes - 1``.
    subjects : numpy.ndarray
        ``int64`` subject number (``1 .. 32``, as in ``sNN.dat``) of each window.
    trials : numpy.ndarray
        ``int64`` trial index (``0 ..``, the file's trial order) of each window.
    ratings : numpy.ndarray
        ``float64`` array ``(N, 4)``: the trial's valence, arousal, dominance, liking.
    num_classes : int
        2 or 4.
    """

    signals: NDArray[np.float32]
    labels: NDArray[np.int64]
    subjects: NDArray[np.int64]
    trials: NDArray[np.int64]
    ratings: NDArray[np.float64]
    num_classes: int


def resolve_deap_dir(root: str | os.PathLike[str]) -> Path:
    """Find the ``data_preprocessed_python`` folder from a user-given root.

    Parameters
    ----------
    root : str or path-like
        The ``data_preprocessed_python`` folder itself, or the folder that contains it.

    Returns
    -------
    pathlib.Path
        The folder holding the ``sNN.dat`` files.

    Raises
    ------
    FileNotFoundError
        If neither folder holds an ``sNN.dat`` file; the message says what to put where.
    """
    base = Path(root).expanduser()
    for candidate in (base, base / DEAP_DIRNAME):
        if candidate.is_dir() and any(_FILE_PATTERN.fullmatch(name) for name in os.listdir(candidate)):
            return candidate
    raise FileNotFoundError(
        f"DEAP not found under {base}: download 'data_preprocessed_python.zip' from "
        f"https://www.eecs.qmul.ac.uk/mmv/datasets/deap/ (licence required) and extract it so that "
        f"{base / DEAP_DIRNAME / 's01.dat'} exists (s01.dat ... s32.dat)"
    )


def deap_subject_files(
    root: str | os.PathLike[str],
    subjects: Iterable[int] | None = None,
) -> dict[int, Path]:
    """Map subject numbers to their ``sNN.dat`` files.

    Parameters
    ----------
    root : str or path-like
        The ``data_preprocessed_python`` folder, or the folder that contains it.
    subjects : iterable of int, optional
        Subject numbers (``1 .. 32``); default: every ``sNN.dat`` in the folder.

    Returns
    -------
    dict of int to pathlib.Path
        Ordered by subject number.

    Raises
    ------
    FileNotFoundError
        If the folder or a requested subject's file is missing.
    ValueError
        On an invalid subject number or an empty or repeated selection.
    """
    folder = resolve_deap_dir(root)
    if subjects is None:
        found = (_FILE_PATTERN.fullmatch(name) for name in os.listdir(folder))
        return {int(match.group(1)): folder / match.group(0) for match in sorted(filter(None, found), key=_match_key)}
    chosen = _check_subjects(subjects)
    files = {subject: folder / f"s{subject:02d}.dat" for subject in chosen}
    missing = [path.name for path in files.values() if not path.is_file()]
    if missing:
        raise FileNotFoundError(
            f"DEAP folder {folder} lacks {', '.join(missing)}: "
            f"extract the complete 'data_preprocessed_python.zip' there"
        )
    return files


def read_deap_subject(path: str | os.PathLike[str]) -> tuple[NDArray[np.floating[Any]], NDArray[np.float64]]:
    """Read and validate one ``sNN.dat`` file.

    Parameters
    ----------
    path : str or path-like
        The subject's file.

    Returns
    -------
    data : numpy.ndarray
        The stored float array ``(T, 40, 8064)``, ``T >= 1`` trials.
    ratings : numpy.ndarray
        ``float64`` array ``(T, 4)``: valence, arousal, dominance, liking.

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    ValueError
        If the file is not a DEAP subject file (not a pickled dict, missing ``data``
        or ``labels``, wrong shapes, non-finite values, ratings outside ``[1, 9]``).
    """
    file = Path(path)
    content = load_pickled_dict(file)
    for key in ("data", "labels"):
        if key not in content:
            raise ValueError(f"{file}: not a DEAP subject file, no '{key}' entry (keys: {sorted(map(str, content))})")
    data, ratings = content["data"], content["labels"]
    expected = f"(trials, {DEAP_NUM_CHANNELS}, {DEAP_SAMPLES_PER_TRIAL})"
    if not isinstance(data, np.ndarray) or data.dtype.kind != "f" or data.ndim != 3:
        raise ValueError(f"{file}: 'data' must be a float array {expected}, got {_describe(data)}")
    if data.shape[0] < 1 or data.shape[1:] != (DEAP_NUM_CHANNELS, DEAP_SAMPLES_PER_TRIAL):
        raise ValueError(f"{file}: 'data' must have shape {expected}, got {data.shape}")
    if not isinstance(ratings, np.ndarray) or ratings.shape != (data.shape[0], len(RATING_DIMENSIONS)):
        raise ValueError(f"{file}: 'labels' must be an array ({data.shape[0]}, 4), got {_describe(ratings)}")
    ratings = _check_ratings(file, ratings)
    return data, ratings


def deap_num_classes(label: str) -> int:
    """Number of classes of a label mode: 4 for ``"valence_arousal"``, else 2.

    Raises
    ------
    ValueError
        On an unknown label mode.
    """
    if label not in DEAP_LABEL_MODES:
        raise ValueError(f"DEAP label must be one of {list(DEAP_LABEL_MODES)}, got {label!r}")
    return 4 if label == "valence_arousal" else 2


def ratings_to_labels(ratings: ArrayLike, label: str = DEFAULT_DEAP_LABEL) -> NDArray[np.int64]:
    """Turn ``(T, 4)`` ratings into class labels.

    Parameters
    ----------
    ratings : array_like
        Valence, arousal, dominance, liking per row.
    label : str, default "valence_arousal"
        A rating dimension (binary: ``1`` when the rating is above 5, else ``0``) or
        ``"valence_arousal"`` (quadrant: ``0`` HVHA, ``1`` HVLA, ``2`` LVHA, ``3`` LVLA).

    Returns
    -------
    numpy.ndarray
        ``int64`` labels, one per row.

    Raises
    ------
    ValueError
        On an unknown label mode or ratings that are not ``(T, 4)``.
    """
    deap_num_classes(label)
    array = np.asarray(ratings, dtype=np.float64)
    if array.ndim != 2 or array.shape[1] != len(RATING_DIMENSIONS):
        raise ValueError(f"ratings must have shape (T, 4), got {array.shape}")
    high = array > HIGH_RATING_THRESHOLD
    if label == "valence_arousal":
        low_valence = ~high[:, RATING_DIMENSIONS.index("valence")]
        low_arousal = ~high[:, RATING_DIMENSIONS.index("arousal")]
        return (2 * low_valence + low_arousal).astype(np.int64)
    return high[:, RATING_DIMENSIONS.index(label)].astype(np.int64)


def load_deap_windows(
    root: str | os.PathLike[str],
    label: str = DEFAULT_DEAP_LABEL,
    num_classes: int | None = None,
    window_seconds: float = DEFAULT_WINDOW_SECONDS,
    subjects: Iterable[int] | None = None,
    standardize: bool = True,
) -> DeapWindows:
    """Load DEAP peripheral windows with labels, subject and trial ids.

    Parameters
    ----------
    root : str or path-like
        The ``data_preprocessed_python`` folder, or the folder that contains it.
    label : str, default "valence_arousal"
        ``"valence"``, ``"arousal"``, ``"dominance"``, ``"liking"`` (binary) or
        ``"valence_arousal"`` (quadrants); see the notes below.
    num_classes : int, optional
        2 or 4; must agree with ``label`` (inferred when omitted).
    window_seconds : float, default 4.0
        Window length; ``window_seconds * 128`` must be a whole number of samples,
        at most 7,680 (60 s).
    subjects : iterable of int, optional
        Subject numbers ``1 .. 32``; default: every ``sNN.dat`` in the folder.
    standardize : bool, default True
        Standardise each channel per subject (see the notes below).

    Returns
    -------
    DeapWindows
        Subjects in increasing order, then trials, then windows in time order.

    Raises
    ------
    FileNotFoundError
        If the folder or a requested subject's file is missing.
    ValueError
        On invalid options or a corrupt file (the message names the file).

    Notes
    -----
    Each ``sNN.dat`` is a Python 2 pickle of a ``dict`` with ``data`` ``(trials, 40 channels, 8064 samples)``
    (128 Hz, 63 s: a 3 s pre-trial baseline, then the 60 s trial) and ``labels`` ``(trials, 4)``: valence,
    arousal, dominance and liking ratings in ``[1, 9]``. Any number of trials is accepted.

    * Channels: the 8 peripheral channels, indices 32..39 (:data:`PERIPHERAL_CHANNEL_NAMES`); the 32 EEG
      channels are not used.
    * Windows: the 3 s baseline is dropped; the 60 s trial is cut into consecutive non-overlapping windows of
      ``window_seconds`` (samples left over at the end are dropped). Each window inherits its trial's label.
    * Standardisation (default on): per subject and per channel, over all of the subject's kept samples,
      ``(x - mean) / std`` (a constant channel becomes zeros); it uses no label.
    * Labels: binary for one rating dimension, ``1`` when the rating is above 5
      (:data:`HIGH_RATING_THRESHOLD`), else ``0``; quaternary (``"valence_arousal"``): the valence x arousal
      quadrant, ``0`` HVHA, ``1`` HVLA, ``2`` LVHA, ``3`` LVLA (:data:`QUADRANT_NAMES`; H = above 5).
    """
    classes = _check_label(label, num_classes)
    window = _window_samples(window_seconds)
    files = deap_subject_files(root, subjects)
    parts = [_subject_windows(subject, path, window, standardize) for subject, path in files.items()]
    signals = np.concatenate([part[0] for part in parts])
    ratings = np.concatenate([part[1] for part in parts])
    return DeapWindows(
        signals=signals,
        labels=ratings_to_labels(ratings, label),
        subjects=np.concatenate([part[2] for part in parts]),
        trials=np.concatenate([part[3] for part in parts]),
        ratings=ratings,
        num_classes=classes,
    )


def load_deap(
    root: str | os.PathLike[str],
    label: str = DEFAULT_DEAP_LABEL,
    num_classes: int | None = None,
    window_seconds: float = DEFAULT_WINDOW_SECONDS,
    subjects: Iterable[int] | None = None,
    standardize: bool = True,
) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """Load DEAP peripheral windows and labels (see :func:`load_deap_windows`).

    Returns
    -------
    signals : numpy.ndarray
        ``float32`` array ``(N, 8, window_samples)``.
    labels : numpy.ndarray
        ``int64`` array ``(N,)``.
    """
    windows = load_deap_windows(root, label, num_classes, window_seconds, subjects, standardize)
    return windows.signals, windows.labels


def deap_train_test_split(
    subjects: ArrayLike,
    trials: ArrayLike,
    test_fraction: float = DEFAULT_DEAP_TEST_FRACTION,
    seed: int = 0,
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Hold out whole trials, per subject, as the test set.

    For each subject, ``round(test_fraction * T)`` of its ``T`` trials (at least 1, at
    most ``T - 1``) are drawn at random; all windows of those trials form the test
    set. The draw for a subject depends only on ``seed``, the subject number and its
    trial ids, so it does not change when other subjects are added or removed.

    Parameters
    ----------
    subjects, trials : array_like
        Per-window subject numbers and trial ids (:class:`DeapWindows` fields).
    test_fraction : float, default 0.2
        Share of each subject's trials held out, in ``(0, 1)``.
    seed : int, default 0
        Non-negative seed.

    Returns
    -------
    train_idx, test_idx : numpy.ndarray
        Sorted ``int64`` window indices.

    Raises
    ------
    ValueError
        On mismatched inputs, a bad fraction or seed, or a subject with a single trial.
    """
    subject_ids = np.asarray(subjects, dtype=np.int64)
    trial_ids = np.asarray(trials, dtype=np.int64)
    if subject_ids.ndim != 1 or subject_ids.shape != trial_ids.shape:
        raise ValueError(f"subjects and trials must be 1-D of equal length, got {subject_ids.shape}, {trial_ids.shape}")
    if isinstance(test_fraction, bool) or not 0.0 < float(test_fraction) < 1.0:
        raise ValueError(f"test_fraction must lie strictly between 0 and 1, got {test_fraction!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    is_test = np.zeros(subject_ids.size, dtype=bool)
    for subject in np.unique(subject_ids):
        mine = subject_ids == subject
        held_out = _held_out_trials(int(subject), np.unique(trial_ids[mine]), float(test_fraction), int(seed))
        is_test |= mine & np.isin(trial_ids, held_out)
    return np.flatnonzero(~is_test).astype(np.int64), np.flatnonzero(is_test).astype(np.int64)


def _held_out_trials(subject: int, trial_ids: NDArray[np.int64], fraction: float, seed: int) -> NDArray[np.int64]:
    """Draw one subject's held-out trials."""
    if trial_ids.size < 2:
        raise ValueError(f"subject {subject} has {trial_ids.size} trial(s); a train/test split needs at least 2")
    count = min(max(1, round(fraction * trial_ids.size)), trial_ids.size - 1)
    rng = np.random.default_rng([seed, _SPLIT_STREAM, subject])
    return rng.permutation(trial_ids)[:count]


def _subject_windows(
    subject: int,
    path: Path,
    window: int,
    standardize: bool,
) -> tuple[NDArray[np.float32], NDArray[np.float64], NDArray[np.int64], NDArray[np.int64]]:
    """One subject's windows, per-window ratings, subject and trial ids."""
    data, ratings = read_deap_subject(path)
    per_trial = _TRIAL_SAMPLES // window
    kept = data[:, list(PERIPHERAL_CHANNELS), _BASELINE_SAMPLES : _BASELINE_SAMPLES + per_trial * window]
    kept = kept.astype(np.float64, copy=False)
    if not np.isfinite(kept).all():
        raise ValueError(f"{path}: the peripheral signals contain NaN or infinite values")
    if standardize:
        mean = kept.mean(axis=(0, 2), keepdims=True)
        std = kept.std(axis=(0, 2), keepdims=True)
        kept = (kept - mean) / np.where(std > 0, std, 1.0)
    trials, channels = kept.shape[:2]
    windows = kept.reshape(trials, channels, per_trial, window).transpose(0, 2, 1, 3)
    signals = np.ascontiguousarray(windows.reshape(trials * per_trial, channels, window), dtype=np.float32)
    trial_ids = np.repeat(np.arange(trials, dtype=np.int64), per_trial)
    return signals, ratings[trial_ids], np.full(trial_ids.size, subject, dtype=np.int64), trial_ids


def _check_label(label: str, num_classes: int | None) -> int:
    """Validate the label mode and class count; return the class count."""
    classes = deap_num_classes(label)
    if num_classes is not None and num_classes != classes:
        raise ValueError(
            f"label={label!r} gives {classes} classes, not num_classes={num_classes!r} "
            f"(use a rating dimension for 2 classes, 'valence_arousal' for 4)"
        )
    return classes


def _window_samples(window_seconds: float) -> int:
    """Validate ``window_seconds``; return the window length in samples."""
    if isinstance(window_seconds, bool) or not isinstance(window_seconds, (int, float, np.integer, np.floating)):
        raise ValueError(f"window_seconds must be a number, got {window_seconds!r}")
    samples = float(window_seconds) * DEAP_SAMPLING_RATE
    if not math.isfinite(samples) or samples <= 0 or abs(samples - round(samples)) > 1e-6:
        raise ValueError(
            f"window_seconds={window_seconds!r} must be positive and a whole number of samples at "
            f"{DEAP_SAMPLING_RATE} Hz (a multiple of 1/{DEAP_SAMPLING_RATE} s)"
        )
    if round(samples) > _TRIAL_SAMPLES:
        seconds = _TRIAL_SAMPLES // DEAP_SAMPLING_RATE
        raise ValueError(f"window_seconds={window_seconds!r} exceeds the {seconds} s trial")
    return int(round(samples))


def _check_subjects(subjects: Iterable[int]) -> list[int]:
    """Validate subject numbers; return them sorted."""
    chosen = list(subjects)
    if not chosen:
        raise ValueError("subjects must name at least one subject (or be None for all)")
    for subject in chosen:
        is_int = isinstance(subject, (int, np.integer)) and not isinstance(subject, bool)
        if not is_int or not 1 <= subject <= DEAP_NUM_SUBJECTS:
            raise ValueError(f"subject numbers are integers 1..{DEAP_NUM_SUBJECTS} (sNN.dat), got {subject!r}")
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"subjects must not repeat, got {chosen}")
    return sorted(int(subject) for subject in chosen)


def _check_ratings(file: Path, ratings: NDArray[Any]) -> NDArray[np.float64]:
    """Validate a subject's ratings: finite, within ``[1, 9]``."""
    try:
        values = ratings.astype(np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{file}: 'labels' are not numbers ({error})") from error
    low, high = _RATING_RANGE
    if not np.isfinite(values).all() or values.min() < low or values.max() > high:
        raise ValueError(
            f"{file}: ratings in 'labels' must lie in [{low:g}, {high:g}], got {values.min()}..{values.max()}"
        )
    return values


def _match_key(match: re.Match[str]) -> int:
    """Subject number of an ``sNN.dat`` match."""
    return int(match.group(1))


def _describe(value: object) -> str:
    """Short description of an unexpected entry."""
    if isinstance(value, np.ndarray):
        return f"{value.dtype} array of shape {value.shape}"
    return type(value).__name__
