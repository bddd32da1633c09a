"""The ``secagg`` backend; the protocol lives in :mod:`secure_afl.secagg`."""

from ..secagg import *  # noqa: F401,F403
from ..secagg import __all__  # noqa: F401
