"""The API's shared response cache: one rebuild of an expired page at a time (others get
the previous page, or wait when there is none), and a change empties it for good."""

from __future__ import annotations

import threading
import time

from cuectl.serve.app import ResponseCache


def _slow(counter: list[int], value: str, delay: float = 0.3):
    def build():
        counter.append(1)
        time.sleep(delay)
        return {"v": value}
    return build


def _run_all(cache: ResponseCache, build, n: int = 8) -> list[bytes]:
    out: list[bytes] = []
    threads = [threading.Thread(target=lambda: out.append(cache.get("k", build)[0])) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return out


def test_concurrent_misses_build_once_and_all_get_the_page():
    cache, calls = ResponseCache(ttl_s=60), []
    bodies = _run_all(cache, _slow(calls, "a"))
    assert len(calls) == 1 and bodies == [b'{"v":"a"}'] * 8


def test_an_expired_page_is_answered_at_once_and_rebuilt_once_in_the_background():
    cache, calls = ResponseCache(ttl_s=0.05), []
    cache.get("k", _slow(calls, "old", 0))
    time.sleep(0.1)  # expired
    held = threading.Event()

    def rebuild():  # held until every caller has its answer: one that waited for it has none
        calls.append(1)
        held.wait(30)
        return {"v": "new"}

    bodies = _run_all(cache, rebuild)
    assert bodies == [b'{"v":"old"}'] * 8  # all eight answered while the rebuild was still held
    held.set()
    deadline = time.monotonic() + 5
    while cache.get("k", _slow(calls, "again", 0))[0] != b'{"v":"new"}' and time.monotonic() < deadline:
        time.sleep(0.02)
    assert calls == [1, 1]  # the first build, and one rebuild for 8 callers
    cache.close()


def test_a_failed_refresh_is_built_again_by_the_next_caller():
    cache, calls = ResponseCache(ttl_s=0.05), []
    cache.get("k", _slow(calls, "old", 0))
    time.sleep(0.1)

    def broken():
        raise RuntimeError("store gone")

    assert cache.get("k", broken)[0] == b'{"v":"old"}'
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            body = cache.get("k", _slow(calls, "fixed", 0))[0]
        except RuntimeError:
            continue
        if body == b'{"v":"fixed"}':
            break
        time.sleep(0.02)
    assert body == b'{"v":"fixed"}'
    cache.close()


def test_a_change_during_a_rebuild_is_not_hidden_by_it():
    cache, calls = ResponseCache(ttl_s=60), []
    started = threading.Event()

    def build():
        started.set()
        time.sleep(0.2)
        return {"v": "before the change"}

    t = threading.Thread(target=lambda: cache.get("k", build))
    t.start()
    started.wait(5)
    cache.clear()  # a change through the API while the page was being read
    t.join(5)
    assert cache.get("k", _slow(calls, "after", 0))[0] == b'{"v":"after"}' and calls == [1]


def test_zero_ttl_never_caches():
    cache, calls = ResponseCache(ttl_s=0), []
    cache.get("k", _slow(calls, "a", 0))
    cache.get("k", _slow(calls, "a", 0))
    assert len(calls) == 2
