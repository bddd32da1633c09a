"""Gradient-based baselines on the same frozen embeddings AFL uses.

* :mod:`.securesum`  every round's sum through a protection backend
  (plain, ckks, secagg), library level: protect -> combine -> reveal;
* :mod:`.heads`      softmax heads in numpy (linear, one hidden layer);
* :mod:`.fl`         FedAvg / FedProx and FedFac (static and dynamic);
* :mod:`.fedfac`     the factor-analysis split of hidden units, computed
  from a secure sum of per-client Grams;
* :mod:`.compare`    ``secure-afl compare``: AFL against the baselines.
"""

from secure_afl_tools.baselines.fedfac import correlation_from_sums, factor_split
from secure_afl_tools.baselines.fl import FLConfig, run_fedavg, run_fedfac
from secure_afl_tools.baselines.heads import LinearHead, MLPHead
from secure_afl_tools.baselines.securesum import SecureSum

__all__ = ["SecureSum", "LinearHead", "MLPHead", "FLConfig", "run_fedavg", "run_fedfac",
           "factor_split", "correlation_from_sums"]
