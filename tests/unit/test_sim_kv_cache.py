"""The simulated engine's prefix cache publishes KV events as real engines do."""

from chaos.sim_engine.kv_cache import PrefixCache, chain_block_hash


def kinds(batch):
    return [e.WhichOneof("data") for e in batch.events]


def test_block_hashes_chain_over_the_prefix():
    a = chain_block_hash(None, [1, 2])
    assert chain_block_hash(a, [3, 4]) != chain_block_hash(None, [3, 4])  # position-aware
    assert chain_block_hash(None, [1, 2]) == a


def test_second_request_hits_the_shared_prefix():
    cache = PrefixCache(block_size=4, capacity_blocks=100, replay_batches_max=100)
    first = cache.acquire(list(range(10)), now=0)
    assert first.cached_tokens == 0
    cache.release(first, 0)
    second = cache.acquire(list(range(8)) + [99, 98, 97, 96], now=1)
    assert second.cached_tokens == 8


def test_stored_events_carry_parent_hash_tokens_and_sequence_numbers():
    cache = PrefixCache(block_size=2, capacity_blocks=100, replay_batches_max=100)
    cache.release(cache.acquire([1, 2, 3, 4], 0), 0)
    cache.release(cache.acquire([1, 2, 3, 4, 5, 6], 0), 0)
    b1, b2 = cache.batches_since(1)
    assert (b1.sequence_number, b2.sequence_number) == (1, 2)
    first = b1.events[0].stored
    assert [list(b.token_ids) for b in first.blocks] == [[1, 2], [3, 4]]
    assert not first.HasField("parent_block_hash")
    second = b2.events[0].stored
    assert second.parent_block_hash == first.blocks[1].block_hash
    assert [list(b.token_ids) for b in second.blocks] == [[5, 6]]


def test_lru_eviction_publishes_removed_leaves_first():
    cache = PrefixCache(block_size=2, capacity_blocks=3, replay_batches_max=100)
    cache.release(cache.acquire([1, 2, 3, 4], 0), 0)
    cache.release(cache.acquire([7, 8, 9, 10], 0), 0)  # 4 blocks > 3: evict the LRU leaf [3, 4]
    last = cache.batches_since(cache.sequence_number)[0]
    assert "removed" in kinds(last)
    removed = [e.removed for e in last.events if e.WhichOneof("data") == "removed"][0]
    assert list(removed.block_hashes) == [chain_block_hash(chain_block_hash(None, [1, 2]), [3, 4])]
    assert cache.used_blocks == 3


def test_pinned_blocks_are_not_evicted():
    cache = PrefixCache(block_size=2, capacity_blocks=1, replay_batches_max=100)
    held = cache.acquire([1, 2, 3, 4], 0)  # 2 blocks pinned, over capacity
    assert cache.used_blocks == 2
    cache.release(held, 0)
    assert cache.used_blocks == 1


def test_one_eviction_pass_takes_a_chain_leaf_first_and_skips_pinned_blocks():
    cache = PrefixCache(block_size=2, capacity_blocks=4, replay_batches_max=100)
    cache.release(cache.acquire([1, 2, 3, 4, 5, 6], 0), 0)  # a chain of 3 blocks, now the LRU ones
    held = cache.acquire([7, 8], 0)  # pinned
    cache.acquire([9, 10, 11, 12, 13, 14], 0)  # 3 more, pinned: 7 blocks, 3 over capacity
    root = chain_block_hash(None, [1, 2])
    middle = chain_block_hash(root, [3, 4])
    leaf = chain_block_hash(middle, [5, 6])
    removed = [e.removed for e in cache.batches_since(cache.sequence_number)[0].events
               if e.WhichOneof("data") == "removed"]
    assert [list(r.block_hashes) for r in removed] == [[leaf, middle, root]]
    assert cache.used_blocks == 4
    cache.release(held, 0)
    assert cache.used_blocks == 4  # [7, 8] is unpinned but the cache is at capacity, not over it


def test_replay_from_a_sequence_number_and_too_old_cursor():
    cache = PrefixCache(block_size=2, capacity_blocks=100, replay_batches_max=2)
    for i in range(4):
        cache.release(cache.acquire([i, i], 0), 0)
    assert [b.sequence_number for b in cache.batches_since(3)] == [3, 4]
    assert cache.batches_since(1) is None  # fell out of the log: the subscriber needs a snapshot
    assert cache.batches_since(5) == []


def test_snapshot_lists_every_block_parent_first_after_a_clear():
    cache = PrefixCache(block_size=2, capacity_blocks=100, replay_batches_max=100)
    cache.release(cache.acquire([1, 2, 3, 4, 5, 6], 0), 0)
    snap = cache.snapshot_batch(0)
    assert kinds(snap)[0] == "cleared"
    hashes = [e.stored.blocks[0].block_hash for e in snap.events[1:]]
    parents = [e.stored.parent_block_hash if e.stored.HasField("parent_block_hash") else None
               for e in snap.events[1:]]
    assert parents[0] is None and parents[1:] == hashes[:-1]
    assert snap.snapshot.count == 1 and snap.snapshot.blocks == 3
