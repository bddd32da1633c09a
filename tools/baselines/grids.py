"""The tuning grids and partitions of the comparison study (``secure-afl compare --all``).

Each grid was widened until its chosen point sat inside it on the seed the study tunes on; where a chosen
value still sits on an edge, the study reports it (``edges`` in its output) unless the edge is one of
:data:`HARD_LIMITS`.
"""

__all__ = ["GRIDS", "FEDFAC_GRID", "DYNAMIC_GRID", "FA_BOUND", "PARTITIONS", "FEDFAC_PARTITIONS", "HARD_LIMITS"]

#: FedProx's mu grid is the FedProx paper's {1, 0.5, 0.1, 0.01, 0.001}.
_MU = (0.001, 0.01, 0.1, 0.5, 1.0)
#: Per method: head, learning rates, local epochs, FedProx mu (0: FedAvg). SGD, as the FedAvg and FedProx papers.
#: Each grid was widened past the edge its previous version chose (FedAvg-linear and FedProx-linear to 50 local
#: epochs, FedAvg-mlp to 20 and down to a step of 0.03, FedProx-mlp's step to 10); FedProx-mlp runs one local
#: epoch, for the compute (each MLP run costs several linear ones). An edge that still results is reported.
GRIDS = {
    "FedAvg-linear": {"head": "linear", "lr": (3.0, 10.0, 30.0, 100.0), "local_epochs": (1, 5, 20, 50), "mu": (0.0,)},
    "FedProx-linear": {"head": "linear", "lr": (3.0, 10.0, 30.0, 100.0), "local_epochs": (1, 5, 20, 50), "mu": _MU},
    "FedAvg-mlp": {"head": "mlp", "lr": (0.03, 0.1, 0.3, 1.0, 3.0, 10.0), "local_epochs": (1, 5, 10, 20),
                   "mu": (0.0,)},
    "FedProx-mlp": {"head": "mlp", "lr": (0.3, 1.0, 3.0, 10.0), "local_epochs": (1,), "mu": _MU},
}
#: FedFac static, coordinate-wise: stage A (Adam step, local epochs) at tau 0.5, kappa 0.8; stage B (tau, kappa)
#: at A's best. tau is the share of personalised hidden units: the FedFac paper's {25, 50, 75 %, inf} and the
#: 90-95 % it found best under strong heterogeneity; 1.0 is its tau = inf (every hidden unit personalised, the
#: output layer still shared), where kappa has no effect and is run once. kappa spans the paper's 0.5-0.95 and
#: below it, where the study's choice went.
FEDFAC_GRID = {"lr": (3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1), "local_epochs": (1, 5),
               "tau": (1 / 64, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 1.0),
               "kappa": (0.3, 0.4, 0.5, 0.6, 0.8, 0.95, 1.0)}
#: FedFac dynamic, tuned on its own the same way; a new split every round costs about three static runs, so
#: kappa stays at 0.8 and the local epochs at 1; the steps span 1e-3 to 0.1 and tau 0.25 to 1.
DYNAMIC_GRID = {"lr": (1e-3, 3e-3, 1e-2, 3e-2, 1e-1), "local_epochs": (1,), "tau": (0.25, 0.5, 0.9, 1.0),
                "kappa": (0.8,)}
#: Edges that are limits of the setting, not of the grid: at least one pass over the local data per round; tau
#: cannot personalise more than every unit, nor fewer than one of the 64 (1/64); kappa 1 keeps every factor;
#: FedProx's mu below the grid is FedAvg (mu = 0), which is run.
HARD_LIMITS = {("local_epochs", "low"), ("tau", "high"), ("tau", "low"), ("kappa", "high"), ("mu", "low")}
#: Declared bound on |entries| of the FedFac unit blocks (updates) in the FA sum: ckks floods at the declared
#: magnitude and the Gram squares it, so the default 100 would bury R in noise. Adam moves an entry by about
#: its step per local step, so 100-odd steps at 3e-3 stay below 1; a larger entry is refused, never wrapped.
FA_BOUND = 1.0
PARTITIONS = ("iid", "dirichlet:0.1", "dirichlet:0.005", "shards:2")
FEDFAC_PARTITIONS = ("dirichlet:0.1", "dirichlet:0.005", "shards:2")
