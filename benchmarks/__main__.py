"""``python -m benchmarks COMMAND``: the ``ebplus`` command line with the benchmark suites, from a checkout."""

import sys

from ebplus.cli import main

sys.exit(main())
