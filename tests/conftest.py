"""Make the test oracles in tests/ and the repository's top-level packages (simulations,
benchmarks) importable however pytest is started."""

import pathlib
import sys

TESTS = pathlib.Path(__file__).resolve().parent
for folder in (TESTS, TESTS.parent):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
