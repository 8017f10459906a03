"""A Dask cluster for what scales with the job (`flightrec analyze --dask ADDRESS`).

Why: beyond one machine's memory or cores, the per-file reading and the per-group timing pass are
the parts that grow with ranks x entries, and both split cleanly: a file is read alone, and every
instance of a collective or transfer lies within one group. The driver keeps what the diagnosis
needs, O(ranks x groups): each rank's summary, recent ops and timing sample. Dask is an optional
extra (`pip install 'flightrec[dask]'`); nothing else imports it.
"""

from __future__ import annotations

from typing import Any

CONNECT_TIMEOUT_S = 30  # a scheduler starting up, or a busy one, may take seconds to answer
DASK_HINT = "--dask needs Dask's distributed scheduler: pip install 'flightrec[dask]'"


class ClusterUnavailable(Exception):
    """Dask is not installed, or no scheduler answers at the address; the message says which."""


def client_for(address: str) -> Any:
    """A client of the scheduler at `address` (`tcp://host:8786`, or a `LocalCluster`'s
    `scheduler_address`); used as a context manager, it closes when done."""
    try:
        from dask.distributed import Client
    except ImportError:
        raise ClusterUnavailable(DASK_HINT) from None
    try:
        return Client(address, set_as_default=False, timeout=f"{CONNECT_TIMEOUT_S}s")
    except OSError as exc:
        raise ClusterUnavailable(f"no Dask scheduler answers at {address} ({exc})") from None


def map_on(client: Any, fn: Any, parts: list[Any], **kwargs: Any) -> list[Any]:
    """`[fn(p, **kwargs) for p in parts]` as tasks on the cluster, results in order. The parts are
    scattered first (sent once, not pickled into each task's graph)."""
    if not parts:
        return []
    futures = client.map(fn, client.scatter(parts), pure=False, **kwargs)
    try:
        return client.gather(futures)
    finally:
        client.cancel(futures)
