"""`python -m bench [--quick]`: start every peer on 127.0.0.1, run the scenarios, print the table."""

from __future__ import annotations

import sys

from bench.run import main

if __name__ == "__main__":
    sys.exit(main())
