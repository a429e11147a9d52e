"""``python -m switchboard.cli``: the tests, the benchmarks and ``switchboard dev``'s
replicas start the command line this way."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
