"""What a ClientApp process imports: in a deployment Flower starts one process per message, so each import is paid
by every node for every market message."""

from __future__ import annotations

import subprocess
import sys


def test_loading_the_client_app_imports_neither_torch_nor_scipy() -> None:
    probe = (
        "import sys, flmarket_flwr.app.client_app; "
        "print(sorted(m for m in ('torch', 'scipy', 'scipy.ndimage') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    assert loaded.stdout.strip() == "[]", loaded.stdout + loaded.stderr


def test_deforming_digits_still_uses_scipy_once_a_data_set_is_built() -> None:
    probe = (
        "import sys, numpy as np; from flmarket_flwr.app.data import digits_xl; "
        "before = 'scipy.ndimage' in sys.modules; "
        "images = np.random.default_rng(0).random((3, 8, 8)).astype(np.float32); "
        "out = digits_xl.deform(images, digits_xl.DeformationStrength(), np.random.default_rng(1)); "
        "print(before, out.shape, 'scipy.ndimage' in sys.modules, bool(np.any(out != images)))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    assert loaded.stdout.split() == ["False", "(3,", "8,", "8)", "True", "True"], loaded.stdout + loaded.stderr
