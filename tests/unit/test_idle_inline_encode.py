"""Long texts are encoded on the event loop while it has nothing else to run, in an encoder thread while it has."""

import trio

from tests.support.tokenizers import load

LONG_TEXT = "The gateway tokenizes every prompt before it reaches the engine, and the engine sees ids. " * 60
CODE_TEXT = "def f(x):\n        return x  +  1\n" * 200  # runs of spaces: the core with lookahead


async def test_an_idle_loop_encodes_a_long_text_itself(qwen_dir):
    svc = load(qwen_dir)
    assert svc.config.inline_chars_max < len(LONG_TEXT) <= svc.config.idle_inline_chars_max
    for text in (LONG_TEXT, CODE_TEXT):
        assert await svc.encode(text) == svc.encode_uncached(text)
    assert not svc._encoders._threads  # never started: nothing was handed over


async def test_a_busy_loop_hands_long_texts_to_the_threads(qwen_dir):
    svc = load(qwen_dir)
    async with trio.open_nursery() as nursery:
        # A task started now waits in the run queue while we encode: what a loaded node's loop has ready.
        nursery.start_soon(trio.lowlevel.checkpoint)
        ids = await svc.encode(LONG_TEXT)
    assert ids == svc.encode_uncached(LONG_TEXT)
    assert svc._encoders._threads


async def test_a_loop_that_spent_its_share_on_long_texts_hands_the_next_to_the_threads(qwen_dir):
    # A window of 10 ms: a quarter of it is spent after ~3 ms of encoding back to back (~10 texts).
    svc = load(qwen_dir, idle_inline_share_max=0.25, idle_inline_window_s=0.01)
    texts = [f"{i} {LONG_TEXT}" for i in range(100)]
    encoded = [await svc.encode(text) for text in texts]  # the loop does nothing else meanwhile
    assert svc._encoders._threads
    assert encoded == [svc.encode_uncached(text) for text in texts]


async def test_past_the_idle_bound_texts_go_to_the_threads(qwen_dir):
    svc = load(qwen_dir, idle_inline_chars_max=len(LONG_TEXT) - 1)
    assert await svc.encode(LONG_TEXT) == svc.encode_uncached(LONG_TEXT)
    assert svc._encoders._threads


async def test_without_the_fast_encoder_long_texts_go_to_the_threads(qwen_dir):
    svc = load(qwen_dir, fast_bpe=False)  # tokenizers' encode holds the GIL: ~7 ms of the loop for a long prompt
    assert await svc.encode(LONG_TEXT) == svc.encode_uncached(LONG_TEXT)
    assert svc._encoders._threads
