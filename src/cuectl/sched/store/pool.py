"""One store connection per thread, for the servers (``cuectl serve`` and its OpenCue
gRPC front door), whose requests run on a thread pool."""

from __future__ import annotations

import threading

from cuectl.sched.store.base import Store


class StorePool:
    """One store connection per thread: SQLite connections may not cross threads, and a
    PostgreSQL connection carries the role it acts as."""

    def __init__(self, db_url: str, *, busy_timeout_s: float = 10.0, reconnect_s: float = 2.0) -> None:
        self._url = db_url
        self._busy_timeout_s = busy_timeout_s
        self._reconnect_s = reconnect_s
        self._local = threading.local()
        self._all: list[Store] = []
        self._lock = threading.Lock()

    def get(self) -> Store:
        store = getattr(self._local, "store", None)
        if store is None:
            from cuectl.sched.store import open_store

            store = open_store(self._url, busy_timeout_s=self._busy_timeout_s, create=False)
            store.reconnect_s = self._reconnect_s  # a request waits a little for a restarting server, not minutes
            self._local.store = store
            with self._lock:
                self._all.append(store)
        return store

    def close(self) -> None:
        with self._lock:
            stores, self._all = self._all, []
        for store in stores:
            try:
                store.close()
            except Exception:
                pass
