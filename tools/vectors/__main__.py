"""``python -m secure_afl_tools.vectors``: :func:`secure_afl_tools.vectors.command.main`."""

import sys

from secure_afl_tools.vectors.command import main

sys.exit(main())
