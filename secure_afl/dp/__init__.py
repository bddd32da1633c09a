"""Distributed differential privacy on the released statistics.

* :mod:`~secure_afl.dp.mechanism` - sensitivity from the declared bound B, the
  Gaussian / Skellam mechanisms and their accounting (dp_accounting);
* :mod:`~secure_afl.dp.noise` - each hospital's noise share, added before
  protection (the session parameters with room for the noise:
  :mod:`secure_afl.backends.session_params`, above the backends);
* :mod:`~secure_afl.dp.solve` - the key holder's PSD repair and calibrated ridge;
* :mod:`~secure_afl.dp.ledger` - composition of every release of a key holder;
* :mod:`secure_afl.privacy_audit` - an empirical lower bound on epsilon;
* :mod:`~secure_afl_tools.bench_dp` - accuracy against epsilon.
"""

from .mechanism import DPSpec, dp_config, release_epsilon, release_rdp, sensitivity
from .noise import add_noise_share, noise_share
from .solve import calibrated_ridge, dp_sanity_check, dp_solve, psd_repair

__all__ = ["DPSpec", "dp_config", "release_epsilon", "release_rdp", "sensitivity", "add_noise_share",
           "noise_share", "calibrated_ridge", "dp_sanity_check", "dp_solve", "psd_repair"]
