"""The API's shared response cache: one rebuild of an ageing page at a time (others get
the previous page while it is within the TTL, or wait for the fresh one once it is not),
never an answer older than the TTL, and a change empties it for good."""

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


class Clock:
    """The cache's clock, moved by the test: ages without sleeping."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_page_near_the_end_of_its_life_is_answered_at_once_and_refreshed_once():
    clock = Clock()
    cache, calls = ResponseCache(ttl_s=10, clock=clock), []
    cache.get("k", _slow(calls, "old", 0))
    clock.now += 9.5  # past its refresh point (a quick build: the last tenth), within the promised 10 s
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


def test_a_page_is_refreshed_three_of_its_builds_before_its_end_at_most_at_half_its_life():
    """A quick page is rebuilt only in the last tenth of its life, not from half of it (that
    doubled the store reads of N pollers); a slow one early enough for its rebuild to end
    in time; never before half its life."""
    clock = Clock()
    cache, calls = ResponseCache(ttl_s=10, clock=clock), []

    def build(value: str, took: float):
        def run():
            calls.append(value)
            clock.now += took  # the build's own duration, on the cache's clock
            return {"v": value}

        return run

    cache.get("quick", build("q", 0.1))
    clock.now += 6  # past half its life, not yet within three builds (0.3 s) or a tenth of it of its end
    assert cache.get("quick", build("q2", 0.1))[0] == b'{"v":"q"}'
    time.sleep(0.2)
    assert calls == ["q"]  # nothing rebuilt
    cache.get("slow", build("s", 2.0))  # three builds: 6 s, more than half: refreshed at half its life
    clock.now += 2.9  # 4.9 s since its read began
    assert cache.get("slow", build("s2", 0.0))[0] == b'{"v":"s"}' and calls == ["q", "s"]
    clock.now += 0.2
    assert cache.get("slow", build("s2", 0.0))[0] == b'{"v":"s"}'
    deadline = time.monotonic() + 5
    while calls[-1] != "s2" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert calls == ["q", "s", "s2"]
    cache.close()


def test_a_page_older_than_the_ttl_is_never_answered_its_callers_wait_for_a_fresh_one():
    clock = Clock()
    cache, calls = ResponseCache(ttl_s=10, clock=clock), []
    cache.get("k", _slow(calls, "old", 0))
    clock.now += 10.5  # a poller slower than the cache: the page is past the promise
    bodies = _run_all(cache, _slow(calls, "new", 0.2))
    assert bodies == [b'{"v":"new"}'] * 8 and calls == [1, 1]  # one build, every caller waited for it
    cache.close()


def test_a_refresh_that_is_still_running_when_the_page_expires_is_waited_for():
    clock = Clock()
    cache, calls = ResponseCache(ttl_s=10, clock=clock), []
    cache.get("k", _slow(calls, "old", 0))
    clock.now += 9.5
    held, started = threading.Event(), threading.Event()

    def rebuild():
        calls.append(1)
        started.set()
        held.wait(30)
        return {"v": "new"}

    assert cache.get("k", rebuild)[0] == b'{"v":"old"}'  # refresh ahead started
    assert started.wait(5)
    clock.now += 1  # the old page is now 10.5 s old: not to be answered any more
    out: list[bytes] = []
    waiter = threading.Thread(target=lambda: out.append(cache.get("k", _slow(calls, "other", 0))[0]))
    waiter.start()
    waiter.join(0.3)
    assert out == []  # waiting for the refresh, not answered with the old page
    held.set()
    waiter.join(10)
    # The refresh began reading at 1009.5, so at 1010.5 its page is 1 s old: fresh, taken as is.
    assert out == [b'{"v":"new"}'] and calls == [1, 1]
    cache.close()


def test_a_failed_refresh_is_built_again_by_the_next_caller():
    clock = Clock()
    cache, calls = ResponseCache(ttl_s=10, clock=clock), []
    cache.get("k", _slow(calls, "old", 0))
    clock.now += 9.5

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
