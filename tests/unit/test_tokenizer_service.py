"""Tokenizer service: cached ids identical to uncached on real texts; caches bounded."""

import random

import pytest

from gateway.auth import ANONYMOUS
from gateway.tokenizer.chat_template import ChatTemplate, TemplateError
from gateway.tokenizer.service import TokenizerConfig, TokenizerService

from .transcripts import MULTILINGUAL, dumps, real_texts, transcripts
from tests.support.tokenizers import load

pytestmark = pytest.mark.corpus  # real transcripts through the tokenizer's caches, the Qwen3 tokenizer loaded per test


BOS_PREPEND = {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                                                         {"Sequence": {"id": "A", "type_id": 0}}],
               "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
               "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [151643],
                                                    "tokens": ["<|endoftext|>"]}}}
EOS_APPEND = {**BOS_PREPEND, "single": [{"Sequence": {"id": "A", "type_id": 0}},
                                        {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}]}


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_cached_ids_equal_uncached_on_growing_transcripts(qwen_dir, seed):
    # Long texts also take the worker-thread path; short ones take L1 too (by default they skip it).
    svc = load(qwen_dir, inline_chars_max=512, fast_inline_chars_max=0, l1_text_chars_min=0)
    for messages in transcripts(seed, count=4):
        for turn in range(1, len(messages) + 1):
            text = svc.chat_template.render(messages[:turn], add_generation_prompt=True)
            assert await svc.encode(text) == svc.encode_uncached(text), f"seed={seed} {dumps(messages[:turn])}"
    stats = svc.statistics()
    assert stats["l1_hits"] > 0 and stats["l1_hit_chars"] > 0


@pytest.mark.parametrize("add_special", [False, True])
async def test_bos_prepending_tokenizer_keeps_ids_identical(qwen_dir, add_special):
    svc = load(qwen_dir, post_processor=BOS_PREPEND)
    assert svc._l1_with_special
    for messages in transcripts(7, count=3):
        for turn in range(1, len(messages) + 1):
            text = svc.chat_template.render(messages[:turn], add_generation_prompt=True)
            expected = svc.encode_uncached(text, add_special_tokens=add_special)
            assert await svc.encode(text, add_special_tokens=add_special) == expected
    if add_special:
        assert (await svc.encode("hi", add_special_tokens=True))[0] == 151643


async def test_appending_post_processor_disables_l1_for_special_tokens(qwen_dir):
    svc = load(qwen_dir, post_processor=EOS_APPEND)
    assert not svc._l1_with_special
    text = svc.chat_template.render([{"role": "user", "content": "x"}], add_generation_prompt=True)
    assert await svc.encode(text, add_special_tokens=True) == svc.encode_uncached(text, add_special_tokens=True)
    assert await svc.encode(text + "y", add_special_tokens=True) == svc.encode_uncached(text + "y", True)


async def test_short_texts_skip_l1_with_the_fast_encoder_and_keep_their_ids(qwen_dir):
    svc = load(qwen_dir, l1_text_chars_min=256)
    assert svc.fast is not None
    short = svc.chat_template.render([{"role": "user", "content": "What is the capital of France?"}])
    assert len(short) < 256
    assert await svc.encode(short) == svc.encode_uncached(short)
    assert svc.statistics()["l1_nodes"] == 0
    long = svc.chat_template.render([{"role": "system", "content": "Be brief. " * 30},
                                     {"role": "user", "content": "What is the capital of France?"}])
    assert len(long) >= 256
    assert await svc.encode(long) == svc.encode_uncached(long)
    assert svc.statistics()["l1_nodes"] > 0
    # The Hugging Face encoder costs ~5x more per character: it keeps L1 for every text.
    slow = load(qwen_dir, l1_text_chars_min=256, fast_bpe=False)
    assert await slow.encode(short) == slow.encode_uncached(short)
    assert slow.statistics()["l1_nodes"] > 0


async def test_l0_returns_the_same_ids_and_is_bounded_by_entries(qwen_dir):
    svc = load(qwen_dir, l0_entries_max=3)
    for i in range(10):
        await svc.encode(f"text number {i}")
    assert svc.statistics()["l0_entries"] == 3
    first = await svc.encode("text number 9")
    assert first == svc.encode_uncached("text number 9")
    assert svc.statistics()["l0_hits"] == 1


async def test_l0_hands_out_a_new_list_on_every_hit(qwen_dir):
    svc = load(qwen_dir, l1_bytes_max=0)
    text = "a text encoded twice, then changed by its caller"
    first = await svc.encode(text)
    first.append(-1)  # a caller extends what it got (as a prompt's assembly does)
    second = await svc.encode(text)
    assert svc.statistics()["l0_hits"] == 1
    assert second == svc.encode_uncached(text) and second is not first
    second.clear()
    assert await svc.encode(text) == svc.encode_uncached(text)


async def test_l0_is_bounded_by_bytes_too(qwen_dir):
    # Long prompts: an entry is the text plus 4 bytes an id (~13 KB each here), so a few fill 40 KB.
    svc = load(qwen_dir, l0_bytes_max=40_000, l1_bytes_max=0)
    texts = [f"prompt {i}: " + " ".join(real_texts())[:6_000] for i in range(8)]
    for text in texts:
        assert await svc.encode(text) == svc.encode_uncached(text)
        stats = svc.statistics()
        assert 0 < stats["l0_bytes"] <= 40_000
    assert 1 <= stats["l0_entries"] < len(texts)
    assert await svc.encode(texts[-1]) == svc.encode_uncached(texts[-1])  # the newest stays
    assert svc.statistics()["l0_hits"] == 1
    assert await svc.encode(texts[0]) == svc.encode_uncached(texts[0])  # the oldest went first
    assert svc.statistics()["l0_hits"] == 1
    # A text larger than the whole cache is not kept (and does not empty it).
    entries = svc.statistics()["l0_entries"]
    huge = " ".join(real_texts())  # ~190,000 characters
    await svc.encode(huge)
    assert svc.statistics()["l0_entries"] == entries


async def test_a_chat_is_cached_once_in_l1_and_a_plain_text_in_l0(qwen_dir):
    svc = load(qwen_dir)
    chat = svc.chat_template.render([{"role": "system", "content": " ".join(real_texts())[:2_000]},
                                     {"role": "user", "content": "What does this say?"}], add_generation_prompt=True)
    tail = "assistant\n"  # after the last boundary (every added token is one: <|im_start|> too)
    assert await svc.encode(chat) == svc.encode_uncached(chat)
    stats = svc.statistics()
    assert stats["l0_entries"] == 0 and stats["l1_nodes"] > 0  # in L1, and not a second copy in L0
    assert await svc.encode(chat) == svc.encode_uncached(chat)
    again = svc.statistics()
    assert again["l1_hit_chars"] == len(chat) - len(tail)
    assert again["encoded_chars"] - stats["encoded_chars"] == len(tail)  # only the tail was encoded again
    plain = "no boundary token in here, " * 20
    assert await svc.encode(plain) == svc.encode_uncached(plain)
    assert await svc.encode(plain) == svc.encode_uncached(plain)
    assert svc.statistics()["l0_entries"] == 1 and svc.statistics()["l0_hits"] == 1


async def test_l1_is_bounded_by_bytes(qwen_dir):
    svc = load(qwen_dir, l1_bytes_max=20_000)
    for messages in transcripts(11, count=5):
        text = svc.chat_template.render(messages, add_generation_prompt=True)
        assert await svc.encode(text) == svc.encode_uncached(text)
        assert svc.statistics()["l1_bytes"] <= 20_000


async def test_caches_off_still_encode(qwen_dir):
    svc = load(qwen_dir, l0_entries_max=0, l1_bytes_max=0)
    text = "<|im_start|>user\nhello<|im_end|>\n"
    assert await svc.encode(text) == svc.encode_uncached(text)
    assert svc.statistics()["l1_nodes"] == 0


@pytest.mark.parametrize("seed", range(5))
def test_incremental_decode_never_splits_a_character(qwen_dir, seed):
    svc = load(qwen_dir)
    rng = random.Random(seed)
    text = "".join(rng.sample(MULTILINGUAL, 4)) + rng.choice(real_texts())[:300]
    ids = svc.encode_uncached(text)
    decoder = svc.new_decode_stream(skip_special_tokens=False)
    pieces, i = [], 0
    while i < len(ids):
        n = rng.randint(1, 4)
        piece = decoder.step(ids[i:i + n])
        assert "\ufffd" not in piece, f"seed={seed}: broken character in {piece!r}"
        pieces.append(piece)
        i += n
    assert "".join(pieces) == svc.decode(ids, skip_special_tokens=False)


@pytest.mark.parametrize("fast_decode", [True, False])
def test_an_answer_cut_inside_a_character_keeps_the_text_before_it(qwen_dir, fast_decode):
    """Found against a real vLLM: a non-streamed answer arrives as one batch of ids, and one that max_tokens cut
    in the middle of a character (an emoji is several byte tokens) came out empty, the whole text held back with
    the partial character and never released. Stepped as its ids one at a time, it is the text before that
    character, as vLLM's per-token detokenizer gives it; the partial character is left out, streamed or not."""
    svc = load(qwen_dir, fast_decode=fast_decode)
    ids = svc.encode_uncached("Cut here: 🦩")  # " \xf0\x9f", "\xa6", "\xa9": the flamingo in three tokens
    before = len(svc.encode_uncached("Cut here:"))
    cut = ids[:before + 1]  # the first of the flamingo's tokens: a space and part of its UTF-8
    assert svc.decode(cut).endswith("\ufffd")
    assert svc.new_decode_stream().step(cut) == "Cut here:"
    streamed = svc.new_decode_stream()
    assert "".join(streamed.step([i]) for i in cut) == "Cut here:"
    whole = svc.new_decode_stream()  # and the rest of the character, when it comes, completes it
    assert whole.step(cut) + whole.step(ids[before + 1:]) == "Cut here: 🦩"


def test_qwen_chat_template_renders_the_real_format(qwen_dir):
    svc = load(qwen_dir)
    text = svc.chat_template.render([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
                                    add_generation_prompt=True)
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    no_think = svc.chat_template.render([{"role": "user", "content": "U"}], add_generation_prompt=True,
                                        enable_thinking=False)
    assert no_think.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_template_sandbox_refuses_mutation_and_reports_raise_exception():
    with pytest.raises(TemplateError):
        ChatTemplate("{{ messages.append(1) }}", {}).render([{"role": "user", "content": "x"}])
    with pytest.raises(TemplateError, match="no system"):
        ChatTemplate("{{ raise_exception('no system') }}", {}).render([])
    with pytest.raises(TemplateError):
        ChatTemplate("{{ messages[0].content.startswith }}{{ messages[5].x.y }}", {}).render(
            [{"role": "user", "content": "x"}])


def test_remembered_attribute_verdicts_equal_the_sandbox_s_own():
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from gateway.tokenizer.chat_template import _Sandbox

    ours, reference = _Sandbox(), ImmutableSandboxedEnvironment()
    objects = [{"a": 1}, [1], "text", 3, (1,), {1}, len, str.upper, "x".upper, type, ours.getattr]
    names = ["append", "update", "pop", "clear", "add", "startswith", "split", "items", "keys", "__class__",
             "_private", "mro", "__globals__", "func_code", "gi_frame", "__self__", "real", "upper"]
    for _ in range(2):  # the second pass answers from what the first remembered
        for obj in objects:
            for name in names:
                value = getattr(obj, name, None)
                assert ours.is_safe_attribute(obj, name, value) == reference.is_safe_attribute(obj, name, value), \
                    (obj, name)
    assert ours._verdicts


def test_remembered_verdicts_are_bounded():
    from gateway.tokenizer.chat_template import _Sandbox

    sandbox = _Sandbox()
    for i in range(_Sandbox.VERDICTS_MAX + 100):
        sandbox.is_safe_attribute("x", f"name{i}", None)
    assert len(sandbox._verdicts) == _Sandbox.VERDICTS_MAX


def test_bundle_loading_matches_directory_loading(qwen_dir, tmp_path):
    from chaos.sim_engine.services import build_tokenizer_bundle
    bundle, _ = build_tokenizer_bundle(qwen_dir)
    a = TokenizerService.from_bundle(bundle, "bundle")
    b = TokenizerService.from_directory(qwen_dir)
    assert a.encode_uncached("héllo <|im_end|>") == b.encode_uncached("héllo <|im_end|>")
    assert a.chat_template.source == b.chat_template.source
    assert a.eos_token_ids == b.eos_token_ids == frozenset({151645})


def test_bad_bundles_are_refused():
    from gateway.tokenizer.service import TokenizerLoadError
    with pytest.raises(TokenizerLoadError):
        TokenizerService.from_bundle(b"not a zip", "x")
    with pytest.raises(TokenizerLoadError):
        TokenizerService({"tokenizer.json": b"{}"}, "x")


async def test_requests_wait_for_a_tokenizer_that_is_loading_instead_of_failing():
    """A gRPC worker registered, its tokenizer still being fetched: a request waits for it (it used to be
    taken for an HTTP-proxied model and answered 503 'no healthy worker')."""
    import io
    import types
    import zipfile

    import trio
    import trio.testing

    from gateway.api.pipeline import ready_model_entry
    from gateway.serving.models import ModelCatalog
    from gateway.tokenizer.bundled import default_tokenizer_dir

    release = trio.Event()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for path in default_tokenizer_dir().iterdir():
            if path.name in ("tokenizer.json", "tokenizer_config.json"):
                zf.write(path, path.name)

    async def fetch_tokenizer_bundle(timeout_s):
        await release.wait()
        return buffer.getvalue()

    worker = types.SimpleNamespace(models=("m",), max_context_tokens=4096, kind="grpc", url="grpc://slow",
                                   client=types.SimpleNamespace(fetch_tokenizer_bundle=fetch_tokenizer_bundle,
                                                                 architectures=()))
    catalog = ModelCatalog(TokenizerConfig(), None, None)
    state = types.SimpleNamespace(catalog=catalog)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(catalog.ensure, worker, 0)
        await trio.testing.wait_all_tasks_blocked()
        assert catalog.get("m").tokenizer is None
        got = []

        async def request():
            got.append(await ready_model_entry(state, "m", ANONYMOUS))

        nursery.start_soon(request)
        await trio.testing.wait_all_tasks_blocked()
        assert not got  # waiting, not failing
        release.set()
    assert got[0].tokenizer is not None
