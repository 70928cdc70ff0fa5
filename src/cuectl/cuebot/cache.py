"""Reads shared between OpenCue clients for a moment, as the REST API's ``--cache``.

One CueGUI polls each open view every 10 s; fifty of them watching the same jobs would
otherwise cost fifty identical store reads a period (bench/bench_opencue.py). An answer
is kept for ``ttl_s`` (1 s by default) keyed by the method and the request's exact bytes,
so only identical requests share it; no answer is older than ``ttl_s``, and every change
made through this server empties the cache at once. Reads are the same for every caller
(nothing is filtered by user), so sharing them shows no one anything they could not read.
Concurrent misses of one key wait for one build rather than each reading the store.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

#: OpenCue's read methods, by name: everything else changes something.
READ_PREFIXES = ("Get", "Find", "Is")


def is_read(path: str) -> bool:
    return path.rpartition("/")[2].startswith(READ_PREFIXES)


class ReadCache:
    def __init__(self, ttl_s: float, size: int = 4096, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._size = size
        self._clock = clock
        self._answers: dict[tuple[str, bytes], tuple[float, Any]] = {}
        self._building: dict[tuple[str, bytes], threading.Lock] = {}
        self._lock = threading.Lock()
        self._generation = 0  # bumped by clear(): a read begun before a change is not kept

    def get(self, path: str, request: bytes, build: Callable[[], Any]) -> Any:
        """The answer to ``request``: a kept one younger than ``ttl_s``, else ``build()``'s
        (kept, unless a change emptied the cache while it was built)."""
        if self.ttl_s <= 0:
            return build()
        key = (path, request)
        hit = self._fresh(key)
        if hit is not None:
            return hit
        with self._lock:
            gate = self._building.setdefault(key, threading.Lock())
        with gate:
            hit = self._fresh(key)  # built by the caller this one waited for
            if hit is not None:
                return hit
            started, generation = self._clock(), self._generation
            answer = build()
            with self._lock:
                self._building.pop(key, None)
                if generation == self._generation:  # no change since the read began
                    if len(self._answers) >= self._size:
                        self._answers.clear()  # bounded: a burst of distinct requests starts over
                    self._answers[key] = (started, answer)
            return answer

    def clear(self) -> None:
        with self._lock:
            self._answers.clear()
            self._generation += 1

    def _fresh(self, key: tuple[str, bytes]) -> Any:
        kept = self._answers.get(key)
        if kept is not None and self._clock() - kept[0] < self.ttl_s:
            return kept[1]
        return None
