"""Long texts up to a bound are encoded on the event loop by the fast encoder, busy or not; longer ones,
and long ones without the fast encoder, in an encoder thread."""

import trio

from tests.support.tokenizers import load

LONG_TEXT = "The gateway tokenizes every prompt before it reaches the engine, and the engine sees ids. " * 60
CODE_TEXT = "def f(x):\n        return x  +  1\n" * 200  # runs of spaces: the core with lookahead


async def test_the_loop_encodes_long_texts_itself(qwen_dir):
    svc = load(qwen_dir)
    assert svc.config.inline_chars_max < len(LONG_TEXT) <= svc.config.fast_inline_chars_max
    for text in (LONG_TEXT, CODE_TEXT):
        assert await svc.encode(text) == svc.encode_uncached(text)
    assert not svc._encoders._threads  # never started: nothing was handed over


async def test_a_busy_loop_encodes_them_too(qwen_dir):
    # A hand-off buys a busy loop no throughput either (BENCHMARKS, issue 65): many at once stay on the loop.
    svc = load(qwen_dir)
    texts = [f"{i} {LONG_TEXT}" for i in range(20)]
    encoded: dict[int, list[int]] = {}

    async def encode(index: int) -> None:
        encoded[index] = await svc.encode(texts[index])

    async with trio.open_nursery() as nursery:
        for index in range(len(texts)):
            nursery.start_soon(encode, index)
    assert [encoded[i] for i in range(len(texts))] == [svc.encode_uncached(text) for text in texts]
    assert not svc._encoders._threads


async def test_past_the_bound_texts_go_to_the_threads(qwen_dir):
    svc = load(qwen_dir, fast_inline_chars_max=len(LONG_TEXT) - 1)
    assert await svc.encode(LONG_TEXT) == svc.encode_uncached(LONG_TEXT)
    assert svc._encoders._threads


async def test_without_the_fast_encoder_long_texts_go_to_the_threads(qwen_dir):
    svc = load(qwen_dir, fast_bpe=False)  # tokenizers' encode holds the GIL: ~7 ms of the loop for a long prompt
    assert await svc.encode(LONG_TEXT) == svc.encode_uncached(LONG_TEXT)
    assert svc._encoders._threads
