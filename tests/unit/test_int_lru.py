"""IntLru: least-recently-used order over int keys that the garbage collector never scans."""

from __future__ import annotations

import gc

from gateway.routing.int_lru import IntLru


def test_order_is_insertion_and_touch_order():
    lru = IntLru()
    for key in (1, 2, 3):
        lru.put(key)
    lru.touch(1)
    lru.touch(99)  # absent: stays absent
    lru.put(2, 7)  # replaced: most recent, with its new value
    assert list(lru) == [3, 1, 2] and lru.get(2) == 7 and 99 not in lru
    lru.discard(3)
    lru.discard(3)
    assert list(lru) == [1, 2] and len(lru) == 2


def test_eviction_takes_the_oldest_down_a_64th_below_the_limit():
    lru = IntLru()
    for key in range(1000):
        lru.put(key, key * 2)
    assert lru.evict_over(1000) == []
    lru.put(1000)
    lru.touch(0)  # recent now: survives
    victims = lru.evict_over(640)
    assert victims == list(range(1, 1 + 1001 - 630))
    assert len(lru) == 630 and 0 in lru and lru.get(1000 - 1) == 1998
    small = IntLru()
    for key in range(5):
        small.put(key)
    assert small.evict_over(4) == [0]  # under 64 keys: exactly to the limit


def test_put_all_is_a_put_for_each_key_in_order():
    one_by_one, at_once = IntLru(), IntLru()
    for lru in (one_by_one, at_once):
        for key in range(10):
            lru.put(key)
    keys = [12, 3, 11, 7, 3, 10]  # new, present, repeated
    for key in keys:
        one_by_one.put(key)
    at_once.put_all(keys)
    assert list(at_once) == list(one_by_one) == [0, 1, 2, 4, 5, 6, 8, 9, 12, 11, 7, 3, 10]


def test_keys_and_values_of_any_size_leave_it_untracked():
    lru = IntLru()
    for key in range(50_000):
        lru.put(key << 64 | key, None if key % 2 else key)
        lru.touch(key // 2)
    lru.evict_over(40_000)
    assert not gc.is_tracked(lru._order)
