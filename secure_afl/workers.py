"""Spawned worker processes for per-item work that holds the GIL (see :func:`map_chunks`).

Kept apart from :mod:`secure_afl.parallel` (the streaming sum of payloads), which imports the backends:
the backends call this module, so it imports nothing of the package.
"""

from __future__ import annotations

import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor

__all__ = ["map_chunks"]


def map_chunks(fn, common, items: list, workers: int) -> list:
    """``[fn(common, chunk) for chunk in chunks]`` over ``workers`` contiguous chunks of ``items``, each in its
    own spawned process (in this one when ``workers`` is 1 or there is one item), results in chunk order.

    ``fn`` must be a module-level function (a spawned interpreter imports it by name) and ``common`` and the
    items picklable. The first exception a chunk raises is raised here once the pool is shut down. For work
    that holds the GIL (small numpy operations, table lookups), where threads do not scale with the cores.
    """
    items = list(items)
    w = max(1, min(int(workers), len(items)))
    if w == 1:
        return [fn(common, items)]
    size = -(-len(items) // w)
    chunks = [items[i:i + size] for i in range(0, len(items), size)]
    with ProcessPoolExecutor(max_workers=len(chunks), mp_context=mp.get_context("spawn")) as pool:
        return list(pool.map(fn, [common] * len(chunks), chunks))
