"""``python -m secure_afl_tools.vectors``: :func:`secure_afl_tools.vectors.command.main`."""

import sys

from secure_afl_tools.vectors.command import main

if __name__ == "__main__":
    sys.exit(main())
