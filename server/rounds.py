"""The server role for a session's backend: one class per kind of round.

Kept apart from :mod:`.aggregator` because the secagg and split rounds
subclass :class:`~.aggregator.AggregationServer`; the base class choosing its
own subclasses would make the two modules import each other.
"""

from __future__ import annotations

from .aggregator import AggregationServer
from .config import ServerConfig
from .secagg_round import SecAggAggregationServer
from .split_round import SplitAggregationServer

__all__ = ["open_server"]


def open_server(config: ServerConfig) -> AggregationServer:
    """The server role for ``config.backend`` (secagg adds its key-exchange rounds, split its share round)."""
    if config.backend == "secagg":
        return SecAggAggregationServer(config)
    if config.backend == "split":
        return SplitAggregationServer(config)
    return AggregationServer(config)
