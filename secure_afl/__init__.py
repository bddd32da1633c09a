"""secure-afl: secure aggregation for Analytic Federated Learning.

The library core has no network code. Public recipe API:

* :mod:`secure_afl.stats`     local statistics C_k, Q_k, n_k (hospital side)
* :mod:`secure_afl.packing`   flat vector layout of the statistics
* :mod:`secure_afl.analytic`  AA law, RI restoration, solve, centralised reference
* :mod:`secure_afl.backends`  plain / ckks / secagg protection behind one interface
"""

__version__ = "0.1.0"
