"""``python -m perflab.report PATH... -o report.html``."""

import sys

from perflab.report import main

if __name__ == "__main__":
    sys.exit(main())
