"""``python -m chronomem ...``: the same command as ``chronomem ...``."""

import sys

from chronomem.cli import main

if __name__ == "__main__":
    sys.exit(main())
