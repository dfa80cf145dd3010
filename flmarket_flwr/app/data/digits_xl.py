"""``digits_xl``: a data set derived from scikit-learn's digits, large enough for the paper's score regime.

Real originals per class are held out as the test set first; each remaining original is kept and joined by
deformed copies (the InfiMNIST recipe: random affine map, elastic field, pixel noise), so no training image
derives from a test image (``train_groups`` / ``test_groups`` name each image's source). The arrays are
deterministic in ``generation_seed`` and the options, generated on first use and cached under
``$FLMARKET_CACHE_DIR`` (:func:`load_digits_xl`).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

import numpy as np
from numpy.typing import NDArray

from flmarket_flwr.app.data.digits import load_digits_arrays, train_test_split_balanced
from flmarket_flwr.app.data.partition import _check_non_negative_int, _check_positive_int

__all__ = [
    "CACHE_ENV",
    "CHOSEN_STRENGTH_FACTOR",
    "DEFAULT_STRENGTH",
    "DEFAULT_TEST_PER_CLASS",
    "DEFAULT_VARIANTS_PER_IMAGE",
    "REFERENCE_STRENGTH",
    "DeformationStrength",
    "DigitsXL",
    "deform",
    "load_digits_xl",
    "upsample_to_rgb",
]

CACHE_ENV: Final[str] = "FLMARKET_CACHE_DIR"
"""Environment variable of the cache folder (default ``~/.cache/flmarket``)."""

DEFAULT_TEST_PER_CLASS: Final[int] = 50
"""Held-out real originals per class (500 test images)."""

DEFAULT_VARIANTS_PER_IMAGE: Final[int] = 11
"""Deformed copies per training original (12 training images per original with it)."""

_FORMAT_VERSION: Final[int] = 1
_DEFORM_STREAM: Final[int] = 0x44584C  # "DXL"


@dataclass(frozen=True)
class DeformationStrength:
    """Ranges of the random deformation (all uniform, symmetric around the identity).

    Attributes
    ----------
    rotation_deg : float
        Largest rotation, degrees.
    scale : float
        Largest relative change of scale (``0.1``: factors in ``[0.9, 1.1]``), per axis.
    shear : float
        Largest shear coefficient.
    shift_px : float
        Largest translation, pixels (of the 8x8 image).
    elastic_alpha : float
        Amplitude of the elastic displacement, pixels (after smoothing, see ``elastic_sigma``).
    elastic_sigma : float
        Standard deviation, pixels, of the Gaussian that smooths the elastic noise.
    noise_std : float
        Standard deviation of the additive Gaussian pixel noise (pixels in ``[0, 1]``).
    """

    rotation_deg: float = 12.0
    scale: float = 0.12
    shear: float = 0.15
    shift_px: float = 0.8
    elastic_alpha: float = 1.0
    elastic_sigma: float = 1.0
    noise_std: float = 0.05

    def scaled(self, factor: float) -> DeformationStrength:
        """Every range times ``factor`` (``elastic_sigma`` unchanged): one knob for tuning."""
        values = {key: value * factor for key, value in asdict(self).items() if key != "elastic_sigma"}
        return DeformationStrength(elastic_sigma=self.elastic_sigma, **values)


REFERENCE_STRENGTH: Final[DeformationStrength] = DeformationStrength()
"""The unit of the strength scale of ``simulations/premise.py`` (its ``--factors`` multiply this)."""

CHOSEN_STRENGTH_FACTOR: Final[float] = 0.75
"""Chosen with ``simulations/premise.py``: at 0.75 the digits CNN's centralised learning curve rises up
to about 300 images per class and is flat beyond (0.89 at 100, 0.96 at 300, 0.97 at 1,000 and 1,488),
as on CIFAR-10; at 0.5 it is flat from 100 (variants too close to their originals), at 0.9 and 1.0 it
flattens later and lower (variants too far from the real test digits)."""

DEFAULT_STRENGTH: Final[DeformationStrength] = REFERENCE_STRENGTH.scaled(CHOSEN_STRENGTH_FACTOR)
"""The deformation of ``digits_xl``: rotation 9 deg, scale 9%, shear 0.11, shift 0.6 px, elastic 0.75 px,
noise 0.0375."""


@dataclass(frozen=True, eq=False)
class DigitsXL:
    """Arrays of the derived data set.

    Attributes
    ----------
    train_images, test_images : numpy.ndarray
        ``float32``, ``(N, 1, 8, 8)``, values in ``[0, 1]``.
    train_labels, test_labels : numpy.ndarray
        ``int64`` labels ``0 .. 9``.
    train_sources, test_sources : numpy.ndarray
        ``int64`` index of the scikit-learn original each image derives from.
    train_is_original : numpy.ndarray
        ``bool``: the training image is an undeformed original.
    """

    train_images: NDArray[np.float32]
    train_labels: NDArray[np.int64]
    train_sources: NDArray[np.int64]
    train_is_original: NDArray[np.bool_]
    test_images: NDArray[np.float32]
    test_labels: NDArray[np.int64]
    test_sources: NDArray[np.int64]


def deform(images: NDArray[np.float32], strength: DeformationStrength, rng: np.random.Generator) -> NDArray[np.float32]:
    """Apply one random InfiMNIST-style deformation to each image, vectorised over the batch.

    Parameters
    ----------
    images : numpy.ndarray
        ``(N, H, W)`` images in ``[0, 1]``.
    strength : DeformationStrength
        Ranges of the random parameters.
    rng : numpy.random.Generator
        Source of every random draw (the result is a function of its state).

    Returns
    -------
    numpy.ndarray
        ``(N, H, W)`` ``float32`` images in ``[0, 1]``.
    """
    count, height, width = images.shape
    rows, cols = np.meshgrid(np.arange(height, dtype=np.float64), np.arange(width, dtype=np.float64), indexing="ij")
    centre_r, centre_c = (height - 1) / 2.0, (width - 1) / 2.0
    matrices = _random_affine(count, strength, rng)  # (N, 2, 2), maps output offsets to input offsets
    shifts = rng.uniform(-strength.shift_px, strength.shift_px, size=(count, 2))
    offsets = np.stack([rows - centre_r, cols - centre_c])  # (2, H, W)
    source = np.einsum("nij,jhw->nihw", matrices, offsets) + shifts[:, :, None, None]
    source[:, 0] += centre_r
    source[:, 1] += centre_c
    source += _elastic_field(count, height, width, strength, rng)
    batch = np.broadcast_to(np.arange(count, dtype=np.float64)[:, None, None], (count, height, width))
    coordinates = np.stack([batch, source[:, 0], source[:, 1]])
    from scipy import ndimage  # pylint: disable=import-outside-toplevel  # only when a data set is built

    warped = ndimage.map_coordinates(images.astype(np.float64), coordinates, order=1, mode="constant", cval=0.0)
    warped += rng.normal(0.0, strength.noise_std, size=warped.shape) if strength.noise_std > 0 else 0.0
    return np.clip(warped, 0.0, 1.0).astype(np.float32)


def _random_affine(count: int, strength: DeformationStrength, rng: np.random.Generator) -> NDArray[np.float64]:
    """``(count, 2, 2)`` rotation x scale x shear matrices with uniformly drawn parameters."""
    angle = np.deg2rad(rng.uniform(-strength.rotation_deg, strength.rotation_deg, size=count))
    scale = 1.0 + rng.uniform(-strength.scale, strength.scale, size=(count, 2))
    shear = rng.uniform(-strength.shear, strength.shear, size=count)
    cos, sin = np.cos(angle), np.sin(angle)
    rotation = np.stack([np.stack([cos, -sin], -1), np.stack([sin, cos], -1)], -2)
    shearing = np.zeros((count, 2, 2))
    shearing[:, 0, 0] = shearing[:, 1, 1] = 1.0
    shearing[:, 0, 1] = shear
    scaling = np.zeros((count, 2, 2))
    scaling[:, 0, 0], scaling[:, 1, 1] = 1.0 / scale[:, 0], 1.0 / scale[:, 1]
    return rotation @ shearing @ scaling


def _elastic_field(
    count: int, height: int, width: int, strength: DeformationStrength, rng: np.random.Generator
) -> NDArray[np.float64]:
    """``(count, 2, H, W)`` smooth random displacements with RMS amplitude ``elastic_alpha``."""
    noise = rng.uniform(-1.0, 1.0, size=(count, 2, height, width))
    if strength.elastic_alpha <= 0:
        return np.zeros_like(noise)
    from scipy import ndimage  # pylint: disable=import-outside-toplevel  # only when a data set is built

    smooth = ndimage.gaussian_filter(noise, sigma=(0, 0, strength.elastic_sigma, strength.elastic_sigma))
    rms = np.sqrt(np.mean(smooth**2, axis=(1, 2, 3), keepdims=True)) + 1e-12
    return strength.elastic_alpha * smooth / rms


def load_digits_xl(
    test_per_class: int = DEFAULT_TEST_PER_CLASS,
    variants_per_image: int = DEFAULT_VARIANTS_PER_IMAGE,
    generation_seed: int = 0,
    strength: DeformationStrength = DEFAULT_STRENGTH,
    cache_dir: str | os.PathLike[str] | None = None,
) -> DigitsXL:
    """Load (generating and caching on first use) the derived ``digits_xl`` arrays.

    Parameters
    ----------
    test_per_class : int, default 50
        Real originals per class held out, before any deformation, as the test set.
    variants_per_image : int, default 11
        Deformed copies of each training original (``0``: the training originals only).
    generation_seed : int, default 0
        Seed of the held-out draw and of every deformation.
    strength : DeformationStrength, default DEFAULT_STRENGTH
        Ranges of the deformation.
    cache_dir : str or path-like, optional
        Cache folder; default ``$FLMARKET_CACHE_DIR`` or ``~/.cache/flmarket``. ``""`` disables
        the cache (always generate).

    Returns
    -------
    DigitsXL
        Fresh, writable arrays.
    """
    _check_positive_int("test_per_class", test_per_class)
    _check_non_negative_int("variants_per_image", variants_per_image)
    _check_non_negative_int("generation_seed", generation_seed)
    params = {
        "version": _FORMAT_VERSION,
        "test_per_class": int(test_per_class),
        "variants_per_image": int(variants_per_image),
        "generation_seed": int(generation_seed),
        "strength": asdict(strength),
    }
    folder = _cache_folder(cache_dir)
    if folder is None:
        return _generate(params, strength)
    digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:16]
    path = folder / f"digits_xl-v{_FORMAT_VERSION}-{digest}.npz"
    if path.is_file():
        with np.load(path) as stored:
            return DigitsXL(**{key: stored[key] for key in stored.files})
    data = _generate(params, strength)
    _save_atomically(path, data)
    return data


def _bilinear_matrix(source: int, target: int) -> NDArray[np.float64]:
    """``(target, source)`` weights of 1-D linear interpolation with half-pixel centres.

    Output pixel ``i`` samples the input at ``(i + 0.5) * source / target - 0.5``, clamped to the
    border: the convention of ``torch.nn.functional.interpolate(mode="bilinear", align_corners=False)``.
    """
    position = np.clip((np.arange(target) + 0.5) * source / target - 0.5, 0.0, source - 1)
    low = np.floor(position).astype(np.int64)
    high = np.minimum(low + 1, source - 1)
    frac = position - low
    weights = np.zeros((target, source))
    np.add.at(weights, (np.arange(target), low), 1.0 - frac)
    np.add.at(weights, (np.arange(target), high), frac)
    return weights


def upsample_to_rgb(images: NDArray[np.float32], size: int = 32, channels: int = 3) -> NDArray[np.float32]:
    """Resize ``(N, 1, H, W)`` images bilinearly to ``size x size`` and repeat them over ``channels``.

    Gives the digits the input shape of the paper's CIFAR models (``3 x 32 x 32`` for ResNet-56):
    ``dataset=digits_xl_rgb32``. Values stay in the input's range (convex weights).

    Parameters
    ----------
    images : numpy.ndarray
        Single-channel images, ``(N, 1, H, W)``.
    size : int, default 32
        Output height and width.
    channels : int, default 3
        Output channels (copies of the one input channel).

    Returns
    -------
    numpy.ndarray
        ``float32`` images of shape ``(N, channels, size, size)``.

    Raises
    ------
    ValueError
        If ``images`` is not ``(N, 1, H, W)`` or ``size`` / ``channels`` is not positive.
    """
    _check_positive_int("size", size)
    _check_positive_int("channels", channels)
    if images.ndim != 4 or images.shape[1] != 1:
        raise ValueError(f"images must have shape (N, 1, H, W), got {images.shape}")
    rows = _bilinear_matrix(images.shape[2], size)
    cols = _bilinear_matrix(images.shape[3], size)
    resized = np.einsum("ih,nhw,jw->nij", rows, images[:, 0].astype(np.float64), cols).astype(np.float32)
    return np.repeat(resized[:, None], channels, axis=1)


def _cache_folder(cache_dir: str | os.PathLike[str] | None) -> Path | None:
    """The cache folder, or ``None`` when caching is disabled (``cache_dir=""``)."""
    if cache_dir is not None:
        return None if str(cache_dir) == "" else Path(cache_dir).expanduser()
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "flmarket").expanduser()


def _save_atomically(path: Path, data: DigitsXL) -> None:
    """Write the arrays to ``path`` through a temporary file (concurrent readers never see half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".npz.tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            np.savez(file, **data.__dict__)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _generate(params: dict[str, object], strength: DeformationStrength) -> DigitsXL:
    """Hold out the test originals, then deform every training original ``variants_per_image`` times."""
    images, labels = load_digits_arrays()
    seed = int(params["generation_seed"])  # type: ignore[call-overload]
    variants = int(params["variants_per_image"])  # type: ignore[call-overload]
    train_idx, test_idx = train_test_split_balanced(labels, int(params["test_per_class"]), seed)  # type: ignore
    sources = np.concatenate([train_idx, np.repeat(train_idx, variants)])
    rng = np.random.default_rng([seed, _DEFORM_STREAM])
    copies = images[np.repeat(train_idx, variants), 0]
    deformed = deform(copies, strength, rng)[:, None] if variants else copies[:, None]
    return DigitsXL(
        train_images=np.concatenate([images[train_idx], deformed]).astype(np.float32),
        train_labels=labels[sources].astype(np.int64),
        train_sources=sources.astype(np.int64),
        train_is_original=np.arange(sources.size) < train_idx.size,
        test_images=images[test_idx].astype(np.float32),
        test_labels=labels[test_idx].astype(np.int64),
        test_sources=test_idx.astype(np.int64),
    )
