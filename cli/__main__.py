"""``python -m secure_afl.cli``: the ``secure-afl`` console script, as the parties' processes start it."""

import sys

from . import main

if __name__ == "__main__":  # importing this module (a walk over every module) runs nothing
    sys.exit(main())
