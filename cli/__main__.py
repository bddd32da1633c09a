"""``python -m secure_afl.cli``: the ``secure-afl`` console script, as the parties' processes start it."""

import sys

from . import main

sys.exit(main())
