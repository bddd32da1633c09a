"""The tuning grids and partitions of the comparison study (``secure-afl compare --all``)."""

__all__ = ["GRIDS", "FEDFAC_GRID", "FA_BOUND", "PARTITIONS", "FEDFAC_PARTITIONS"]

#: Per method: head, learning rates, local epochs, FedProx mu (0: FedAvg). SGD, as the FedAvg and FedProx papers.
GRIDS = {
    "FedAvg-linear": {"head": "linear", "lr": (3.0, 10.0, 30.0, 100.0), "local_epochs": (1, 5), "mu": (0.0,)},
    "FedProx-linear": {"head": "linear", "lr": (3.0, 10.0, 30.0, 100.0), "local_epochs": (1, 5), "mu": (0.01, 0.1)},
    "FedAvg-mlp": {"head": "mlp", "lr": (0.3, 1.0, 3.0), "local_epochs": (1, 5), "mu": (0.0,)},
    "FedProx-mlp": {"head": "mlp", "lr": (0.3, 1.0, 3.0), "local_epochs": (1, 5), "mu": (0.01, 0.1)},
}
#: FedFac, coordinate-wise: stage A (Adam step, local epochs) at tau 0.5, kappa 0.8; stage B (tau, kappa) at A's best.
FEDFAC_GRID = {"lr": (1e-3, 3e-3), "local_epochs": (1, 5), "tau": (0.25, 0.5, 0.75), "kappa": (0.6, 0.9)}
#: Declared bound on |entries| of the FedFac unit blocks (updates) in the FA sum: ckks floods at the declared
#: magnitude and the Gram squares it, so the default 100 would bury R in noise. Adam moves an entry by about
#: its step per local step, so 100-odd steps at 3e-3 stay below 1; a larger entry is refused, never wrapped.
FA_BOUND = 1.0
PARTITIONS = ("iid", "dirichlet:0.1", "dirichlet:0.005", "shards:2")
FEDFAC_PARTITIONS = ("dirichlet:0.1", "dirichlet:0.005", "shards:2")
