"""The benchmark suites that make the documentation's figures; run from a checkout, not installed.

``make bench-*`` and ``python -m benchmarks COMMAND`` run them from the repository root.
The reliability and scale-out benchmarks drive the fault-injection harness that the end-to-end
tests use (``tests/harness``, imported as ``harness``): its folder is put on the import path here,
so a benchmark never needs a second copy of it.
"""

import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parent.parent / "tests")
if _TESTS not in sys.path:
    sys.path.append(_TESTS)
