"""The tokenizer service: a Hugging Face tokenizer, its chat template, and the caches.

Loads ``tokenizer.json`` plus ``tokenizer_config.json`` from a directory, or
from the zip bundle an engine streams with ``GetTokenizer``.

Where a text is encoded: a 7,800-token prompt takes ~0.9 ms with the fast
encoder (tiktoken's core) and ~7 ms with ``tokenizers`` (whose
``Tokenizer.encode`` holds the GIL throughout; ``encode_batch([text])``
releases it). With the fast encoder, texts up to
``fast_inline_chars_max`` characters are encoded on the loop: the hand-off to a
thread and back costs more CPU than it saves, and on a saturated loop it bought
no throughput either. Longer texts, and with ``tokenizers`` texts of
``inline_chars_max`` characters or more, go to the encoder threads
(``encoder_threads.py``), each with an encoder of its own.

Both caches are consulted on the event loop thread only (they are plain
dicts); only the encode itself runs in an encoder thread.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import logging
import os
import json
import re
import zipfile
from pathlib import Path
from typing import Any

import orjson
import tokenizers
from tokenizers.decoders import DecodeStream

from .cache import ExactCache, SegmentCache
from .chat_template import ChatTemplate
from .encoder_threads import EncoderThreads
from .fast_bpe import FastBpe, NotEquivalent
from .fast_decode import ByteLevelDecoder, ByteLevelStream
from .literal_spans import LiteralSpans
from .fast_template import FUEL
from ..base.options import Option

log = logging.getLogger("gateway.tokenizer")

# Files we read from a bundle, and how big each may be (a bundle comes from an engine,
# i.e. from outside: a zip bomb must not take the node down).
_BUNDLE_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.json", "chat_template.jinja",
                 "generation_config.json", "config.json", "preprocessor_config.json", "processor_config.json",
                 "video_preprocessor_config.json")
BUNDLE_FILE_BYTES_MAX = 128 * 1024 * 1024
# The model's own descriptions (config.json: an embedding model's matryoshka sizes; the image processor's
# configs): small JSON, read whole, so bounded far below the tokenizer's.
MODEL_FILE_BYTES_MAX = 4 * 1024 * 1024
_MODEL_FILES = ("config.json", "preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json")


@dataclasses.dataclass(frozen=True)
class TokenizerConfig:
    # L0: exact texts, bounded by entries (SMG's default is 10,000) and by an estimate of
    # bytes (the text plus 4 bytes an id). 64 MiB hold 4,096 short chats (~1 KB each)
    # or ~900 prompts of 7,800 tokens (~70 KB each: ~38 KB of text, ~31 KB of ids).
    l0_entries_max: int = 4096
    l0_bytes_max: int = 64 * 1024 * 1024
    # L1: prefixes at special-token boundaries, bounded by an estimate of bytes.
    # 64 MiB holds ~2 M cached tokens of prefix.
    l1_bytes_max: int = 64 * 1024 * 1024
    # Texts shorter than this skip L1 (no lookup, no insert) when the fast encoder is in use: a one-line
    # chat (~90 characters) encodes in ~19 us whole, while cutting it into segments, looking them up
    # and inserting the new ones costs ~46 us in all; from ~500 characters on (a system prompt to
    # reuse) L1 is ahead (BENCHMARKS.md, sixth pass). The Hugging Face encoder is ~5x slower per
    # character, so it always uses L1.
    l1_text_chars_min: int = 256
    # Texts shorter than this are encoded on the event loop by tokenizers (~0.4 ms for 2,000
    # characters; it holds the GIL, so longer ones go to an encoder thread, which releases it).
    inline_chars_max: int = 2048
    # With the fast encoder, texts up to this are encoded on the event loop. The hand-off to a thread and
    # back (a queue, the thread's wake-up, the GIL taken back for the ids, the loop's own wake-up) costs
    # more CPU than it saves, and bought no throughput even with the loop saturated: a unique
    # ~7,800-token chat at 32 connections, 1.93 -> 1.70 ms of CPU a request and 561 -> 583 requests a
    # second; at 4 connections 1.87 -> 1.62 ms, 568 -> 608 (BENCHMARKS, issue 65). 48 Ki characters:
    # ~12,000 tokens of English text, ~1 ms of the loop at the lookahead-free core's ~70 ns a token
    # (~1.5 ms for a text it does not take: runs of spaces), the longest pause it puts in other streams.
    fast_inline_chars_max: int = 48 * 1024
    # Encoder threads (both encoders release the GIL, so these run truly in parallel), each
    # with its own fast encoder (two tiktoken cores: ~35-56 MB, ~120 ms to build), made by the
    # thread when the first text over fast_inline_chars_max comes. 0 means
    # one per core; ``serve --workers N`` gives each of its N processes its share of the cores.
    encode_threads: int = 0
    # Encode with tiktoken's core where it gives the same ids as tokenizers (fast_bpe.py: ~4-6x
    # faster); tokenizers it cannot reproduce keep the Hugging Face encoder.
    fast_bpe: bool = True
    # Detokenize byte-level BPE tokenizers from a table of token bytes where it gives DecodeStream's
    # pieces (fast_decode.py: no window re-decoded per step); others keep DecodeStream.
    fast_decode: bool = True
    # Render chat templates with MiniJinja where it renders a battery of conversations exactly as
    # Jinja2 does (fast_template.py: 2-5x faster); Jinja2 renders the others and every failure.
    fast_chat_template: bool = True
    # Instructions one MiniJinja render may run before the request fails (fast_template.py: the
    # default fits ~1,500 messages on templates that rescan the conversation per message, and holds
    # the event loop ~0.5-1 s at most). Templates on Jinja2 have no such bound.
    chat_template_fuel: int = FUEL


class TokenizerLoadError(Exception):
    """The tokenizer files are missing or unusable."""


def _read_bundle(zip_bytes: bytes) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    try:
        with zipfile.ZipFile(io.BytesIO(zip_bytes)) as zf:
            for info in zf.infolist():
                name = Path(info.filename).name
                if name not in _BUNDLE_FILES or info.is_dir():
                    continue
                if info.file_size > (MODEL_FILE_BYTES_MAX if name in _MODEL_FILES else BUNDLE_FILE_BYTES_MAX):
                    raise TokenizerLoadError(f"{name} in the tokenizer bundle is {info.file_size} bytes; too large")
                files[name] = zf.read(info)
    except zipfile.BadZipFile as e:
        raise TokenizerLoadError(f"tokenizer bundle is not a zip file: {e}") from e
    if "tokenizer.json" not in files:
        raise TokenizerLoadError("tokenizer bundle has no tokenizer.json")
    return files


def _read_directory(path: Path) -> dict[str, bytes]:
    if not (path / "tokenizer.json").is_file():
        raise TokenizerLoadError(f"{path} has no tokenizer.json")
    return {name: (path / name).read_bytes() for name in _BUNDLE_FILES if (path / name).is_file()}


def _json_object(files: dict[str, bytes], name: str, source: str) -> dict[str, Any]:
    raw = files.get(name)
    if raw is None or len(raw) > MODEL_FILE_BYTES_MAX:
        return {}
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as e:
        log.warning("tokenizer %s: %s is not readable JSON (%s); ignored", source, name, e)
        return {}
    return value if isinstance(value, dict) else {}


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _no_encoder() -> None:
    """What an encoder thread holds without the fast encoder: its jobs use the shared Hugging Face tokenizer."""
    return None


class TokenizerService:
    def __init__(self, files: dict[str, bytes], source: str, config: TokenizerConfig = TokenizerConfig(),
                 chat_template_override: str | None = None) -> None:
        self.source = source
        self.config = config
        tokenizer_json = files["tokenizer.json"].decode("utf-8")
        try:
            self.tokenizer = tokenizers.Tokenizer.from_str(tokenizer_json)
        except Exception as e:  # the Rust side raises plain Exception on a malformed file
            raise TokenizerLoadError(f"cannot load tokenizer.json from {source}: {e}") from e
        # Parsed once for both fast paths' checks; orjson refuses a few things json takes (unpaired
        # surrogate escapes): then each parses on its own, and refuses what it cannot read.
        try:
            spec = orjson.loads(tokenizer_json) if config.fast_bpe or config.fast_decode else None
        except orjson.JSONDecodeError:
            spec = None
        self.fast: FastBpe | None = None
        self.fast_refusal = "disabled (--disable-fast-tokenizer)"
        if config.fast_bpe:
            try:
                # The checked encoder's regex pools now belong to the thread that checked it (this
                # may be a loading thread): the event loop encodes with a fork (FastBpe.fork), with the
                # lookahead-free core for the long texts it encodes itself (fast_inline_chars_max).
                self.fast = FastBpe.build(tokenizer_json, self.tokenizer, spec).fork()
                self.fast_refusal = ""
                log.info("tokenizer %s: encoding with tiktoken's BPE (identical ids: every check passed)", source)
            except (NotEquivalent, KeyError, TypeError, ValueError, AttributeError) as e:
                # An unexpected shape of tokenizer.json is a refusal too: the reference encoder stays.
                self.fast_refusal = str(e) or type(e).__name__
                log.info("tokenizer %s: encoding with tokenizers (fast BPE not identical: %s)", source, e)
        self.fast_decoder: ByteLevelDecoder | None = None
        self.fast_decode_refusal = "disabled (--disable-fast-detokenizer)"
        if config.fast_decode:
            try:
                self.fast_decoder = ByteLevelDecoder.build(tokenizer_json, self.tokenizer, spec)
                self.fast_decode_refusal = ""
            except (NotEquivalent, KeyError, TypeError, ValueError, AttributeError) as e:
                self.fast_decode_refusal = str(e) or type(e).__name__
                log.info("tokenizer %s: detokenizing with DecodeStream (byte table not identical: %s)", source, e)
        tokenizer_config: dict[str, Any] = {}
        if "tokenizer_config.json" in files:
            tokenizer_config = json.loads(files["tokenizer_config.json"])
        # The model's config.json and image processor configs, as the engine ships them (empty when absent or
        # unreadable: what depends on them then says the model lacks the feature).
        self.model_files = {name: _json_object(files, name, source) for name in _MODEL_FILES}
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        # No token stands for more characters than its own text has (byte-level: one character per
        # byte; a text character is at least a byte), so a text longer than context x this cannot fit
        # and is refused before it is encoded (gateway.api.openai.check_prompt_chars).
        self.token_chars_max = max(map(len, self.tokenizer.get_vocab(with_added_tokens=True)), default=1)

        special = {name: _token_text(tokenizer_config.get(name))
                   for name in ("bos_token", "eos_token", "pad_token", "unk_token")}
        self.eos_token_ids = self._eos_ids(special["eos_token"], files)
        self.special_token_ids = frozenset(
            i for i, t in self.tokenizer.get_added_tokens_decoder().items()
            if t.special)
        # Client text spelling any added token is encoded as plain text (literal_spans.py).
        self.literal_spans = LiteralSpans([t.content for t in self.tokenizer.get_added_tokens_decoder().values()])
        self._plain_tokenizer: tokenizers.Tokenizer | None = None  # made on first use: rare, ~tens of MB

        template_source = chat_template_override or self._template_source(tokenizer_config, files)
        self.chat_template = ChatTemplate(template_source, special, fast=config.fast_chat_template,
                                          fuel=config.chat_template_fuel) if template_source else None

        self._l0 = ExactCache(config.l0_entries_max, config.l0_bytes_max)
        self._l1 = SegmentCache(config.l1_bytes_max)
        self._boundary = self._boundary_pattern()
        self._l1_with_special = self._special_tokens_only_prepended()
        threads = config.encode_threads or max(1, len(os.sched_getaffinity(0)))
        # Long texts: each thread with its own fork of the fast encoder, made by the thread when the
        # first one comes (encoder_threads.py says why), or the shared Hugging Face tokenizer
        # (encode_batch releases the GIL).
        fast = self.fast
        self._encoders = EncoderThreads(fast.fork if fast is not None else _no_encoder, threads)
        self.encoded_chars = 0

    # -- loading ----------------------------------------------------------

    @classmethod
    def from_directory(cls, path: Path, config: TokenizerConfig = TokenizerConfig(),
                       chat_template_path: Path | None = None) -> "TokenizerService":
        override = chat_template_path.read_text(encoding="utf-8") if chat_template_path else None
        return cls(_read_directory(Path(path)), str(path), config, override)

    @classmethod
    def from_bundle(cls, zip_bytes: bytes, source: str, config: TokenizerConfig = TokenizerConfig(),
                    chat_template_path: Path | None = None) -> "TokenizerService":
        override = chat_template_path.read_text(encoding="utf-8") if chat_template_path else None
        return cls(_read_bundle(zip_bytes), source, config, override)

    @staticmethod
    def _template_source(tokenizer_config: dict[str, Any], files: dict[str, bytes]) -> str | None:
        if "chat_template.jinja" in files:
            return files["chat_template.jinja"].decode("utf-8")
        template = tokenizer_config.get("chat_template")
        if template is None and "chat_template.json" in files:
            template = json.loads(files["chat_template.json"]).get("chat_template")
        if isinstance(template, list):  # named templates: use "default"
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        return template if isinstance(template, str) else None

    def _eos_ids(self, eos_text: str | None, files: dict[str, bytes]) -> frozenset[int]:
        ids: set[int] = set()
        if eos_text:
            eos_id = self.tokenizer.token_to_id(eos_text)
            if eos_id is not None:
                ids.add(eos_id)
        if "generation_config.json" in files:
            value = json.loads(files["generation_config.json"]).get("eos_token_id")
            ids.update(value if isinstance(value, list) else [value] if isinstance(value, int) else [])
        return frozenset(ids)

    def _boundary_pattern(self) -> "re.Pattern[str] | None":
        """Special tokens after which the text can be cut without changing the ids.

        Tokens that strip neighbouring whitespace (lstrip/rstrip) would take
        characters from the next segment, so they are not boundaries.
        """
        texts = [t.content for t in self.tokenizer.get_added_tokens_decoder().values()
                 if t.special and not t.lstrip and not t.rstrip and not t.single_word and t.content]
        if not texts:
            return None
        return re.compile("|".join(re.escape(t) for t in sorted(texts, key=len, reverse=True)))

    def _special_tokens_only_prepended(self) -> bool:
        """True when add_special_tokens only puts ids in front (a BOS), never after.

        A post-processor that appends (an EOS, a [SEP]) would put ids after
        every cached prefix too, so L1 is used for add_special_tokens=True
        only when appending is impossible.
        """
        plain = self.tokenizer.encode("a b", add_special_tokens=False).ids
        with_special = self.tokenizer.encode("a b", add_special_tokens=True).ids
        return with_special[len(with_special) - len(plain):] == plain

    # -- encoding ---------------------------------------------------------

    def _segments(self, text: str) -> list[str]:
        """Text cut right after each boundary token; the last piece is the tail."""
        if self._boundary is None:
            return [text]
        cuts = [m.end() for m in self._boundary.finditer(text)]
        pieces: list[str] = []
        start = 0
        for cut in cuts:
            pieces.append(text[start:cut])
            start = cut
        pieces.append(text[start:])
        return pieces

    def _encode_pieces(self, pieces: "list[str]", add_special_tokens: bool,
                       fast: "FastBpe | None") -> list[list[int]]:
        """The ids of each piece, as encoding their concatenation gives them.

        Pieces are cut right after added tokens, which both encoders split the text at before anything
        else, so each piece encodes on its own to its share of the whole (fast encoder); the Hugging
        Face encoder encodes the whole once and shares the ids out by character offsets.
        """
        if fast is not None:
            return [fast.encode(piece, add_special_tokens and i == 0) for i, piece in enumerate(pieces)]
        text = "".join(pieces)
        encoding = self.tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)[0]
        if len(pieces) == 1:
            return [encoding.ids]
        return self._split_ids(encoding.ids, encoding.offsets, pieces)

    async def _encode_off_loop(self, pieces: "list[str]", add_special_tokens: bool) -> list[list[int]]:
        """On the loop with the fast encoder up to ``fast_inline_chars_max`` characters, with tokenizers below
        ``inline_chars_max``; longer texts in an encoder thread, GIL released."""
        chars = sum(map(len, pieces))
        if chars < self.config.inline_chars_max or (self.fast is not None and
                                                    chars <= self.config.fast_inline_chars_max):
            return self._encode_pieces(pieces, add_special_tokens, self.fast)
        return await self._encoders.run(lambda fast: self._encode_pieces(pieces, add_special_tokens, fast))

    async def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``, through L1 or L0; identical to an uncached encode.

        A text with a complete segment (a chat: every message ends with a boundary token) is
        cached in L1 only: its ids are its cached segments' plus its tail's, and an L0 entry
        would hold the same ids again (for a 7,800-token prompt, ~31 KB, packed on every
        request). L0 holds what L1 cannot: short texts, texts without a boundary token.
        """
        if self._l1_applies(text, add_special_tokens):
            segments = self._segments(text)
            if len(segments) > 1:
                return await self._encode_with_segments(segments, add_special_tokens)
        cached = self._l0.get(text, add_special_tokens)
        if cached is not None:
            return cached
        self.encoded_chars += len(text)
        ids = (await self._encode_off_loop([text], add_special_tokens))[0]
        self._l0.put(text, add_special_tokens, ids)
        return ids

    async def encode_with_literals(self, parts: "list[tuple[str, bool]]") -> list[int]:
        """Ids of a rendered prompt cut by ``LiteralSpans.split``: its text as ``encode`` gives it,
        the client's spans with special tokens encoded as plain text."""
        ids: list[int] = []
        for text, literal in parts:
            ids += self.encode_plain(text) if literal else await self.encode(text, add_special_tokens=False)
        return ids

    def encode_plain(self, text: str) -> list[int]:
        """``text`` with no special token recognised in it (short spans only: on the event loop)."""
        if self._plain_tokenizer is None:
            self._plain_tokenizer = tokenizers.Tokenizer.from_str(self.tokenizer.to_str())
            self._plain_tokenizer.encode_special_tokens = True
        return self._plain_tokenizer.encode(text, add_special_tokens=False).ids

    def _l1_applies(self, text: str, add_special_tokens: bool) -> bool:
        return self._boundary is not None and self._l1.bytes_max > 0 and (
            not add_special_tokens or self._l1_with_special) and (
            self.fast is None or len(text) >= self.config.l1_text_chars_min)

    async def _encode_with_segments(self, segments: "list[str]", add_special_tokens: bool) -> list[int]:
        complete = segments[:-1]  # each ends with a boundary token; the tail may still grow
        match = self._l1.longest_prefix(complete, add_special_tokens)
        new_segments = complete[match.segments:]
        # Special tokens (a BOS) belong to the start of the text, already in the cached ids.
        rest_special = add_special_tokens and match.chars == 0
        rest = [*new_segments, segments[-1]]
        self.encoded_chars += sum(map(len, rest))
        pieces = await self._encode_off_loop(rest, rest_special)
        if new_segments:
            self._l1.insert(match.parent_node_id, new_segments, pieces[:-1])
        ids = match.ids  # a new list, ours to extend
        for piece in pieces:  # each a new list too (L1 keeps packed copies): the first is taken as it is
            if ids:
                ids += piece
            else:
                ids = piece
        return ids

    @staticmethod
    def _split_ids(ids: "list[int]", offsets: "list[tuple[int, int]]", segments: "list[str]") -> list[list[int]]:
        """Ids of each segment, assigned by the character offsets of each token."""
        out: list[list[int]] = []
        start = 0
        boundary = 0
        for segment in segments:
            boundary += len(segment)
            end = start
            while end < len(ids) and offsets[end][1] <= boundary:
                end += 1
            out.append(list(ids[start:end]))
            start = end
        return out

    def encode_uncached(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Plain encode without caches: the reference the cached path must equal (tests, benchmarks)."""
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    # -- decoding ---------------------------------------------------------

    def decode(self, ids: "list[int]", skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def new_decode_stream(self, skip_special_tokens: bool = True, kept_special: "frozenset[str]" = frozenset()
                          ) -> "IncrementalDecoder | ByteLevelStream":
        """A stream of text from ids; special tokens dropped when ``skip_special_tokens`` is set, but for
        those spelled as one of ``kept_special`` (the markers a parser reads)."""
        if self.fast_decoder is not None:
            return self.fast_decoder.new_stream(skip_special_tokens, kept_special)
        if skip_special_tokens and kept_special:
            return IncrementalDecoder(self.tokenizer, False, self._special_ids_except(kept_special))
        return IncrementalDecoder(self.tokenizer, skip_special_tokens)

    def _special_ids_except(self, kept_special: "frozenset[str]") -> frozenset[int]:
        return frozenset(i for i, token in self.tokenizer.get_added_tokens_decoder().items()
                         if token.special and token.content not in kept_special)

    @functools.cached_property
    def special_ids(self) -> frozenset[int]:
        """The ids of special tokens (those skip_special_tokens leaves out of the text)."""
        return self._special_ids_except(frozenset())

    def id_to_token(self, token_id: int) -> str | None:
        return self.tokenizer.id_to_token(token_id)

    def token_bytes(self, token_id: int) -> bytes:
        """What one token writes, as bytes: a byte-level token may hold part of a UTF-8 character (from the
        decoder's table); without that table, its decoding alone (a partial character comes out as U+FFFD)."""
        if self.fast_decoder is not None:
            return self.fast_decoder.token_bytes(token_id)
        return self.tokenizer.decode([token_id], skip_special_tokens=False).encode("utf-8")

    def token_to_id(self, token: str) -> int | None:
        """The id of a token spelled exactly so (a marker such as ``</think>``), None if it is not one token."""
        return self.tokenizer.token_to_id(token)

    def count_tokens(self, text: str) -> int:
        """How many tokens ``text`` encodes to (synchronously, uncached: for short texts off the hot path)."""
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    # -- statistics -------------------------------------------------------

    def statistics(self) -> dict[str, int]:
        return {
            "l0_hits": self._l0.hits, "l0_misses": self._l0.misses, "l0_entries": len(self._l0),
            "l0_bytes": self._l0.size_bytes,
            "l1_hits": self._l1.hits, "l1_misses": self._l1.misses, "l1_nodes": len(self._l1),
            "l1_bytes": self._l1.size_bytes, "l1_hit_chars": self._l1.hit_chars, "encoded_chars": self.encoded_chars,
        }


class IncrementalDecoder:
    """Text from token ids as they arrive, never splitting a UTF-8 character.

    ``tokenizers``' ``DecodeStream`` holds back ids until they decode to whole
    characters (byte-level BPE spreads an emoji over several tokens), so each
    piece of text it returns is final. Given several ids at once it holds them
    all back when the last ends inside a character, so a batch is stepped one
    id at a time: a non-streamed answer cut in the middle of a character is its
    text less that character (as vLLM's per-token detokenizer gives it).
    """

    def __init__(self, tokenizer: tokenizers.Tokenizer, skip_special_tokens: bool,
                 dropped_ids: "frozenset[int]" = frozenset()) -> None:
        self._tokenizer = tokenizer
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        self._skip_special = skip_special_tokens
        self._dropped_ids = dropped_ids  # special tokens skipped by hand when some others are kept

    def step(self, ids: "list[int] | tuple[int, ...]") -> str:
        if self._dropped_ids:
            ids = [i for i in ids if i not in self._dropped_ids]
        if not ids:
            return ""
        step, tokenizer = self._stream.step, self._tokenizer
        if len(ids) == 1:
            try:
                return step(tokenizer, ids[0]) or ""
            except Exception:  # an id the vocabulary does not have: skipped
                return ""
        try:
            # The batch at once when its own text ends on a whole character (then so does the stream's window,
            # which ends with the same bytes): one call; else its ids one at a time.
            if not tokenizer.decode(list(ids), skip_special_tokens=self._skip_special).endswith("\ufffd"):
                return step(tokenizer, list(ids)) or ""
        except Exception:  # an id the vocabulary does not have: one at a time, skipping it
            pass
        return "".join([self.step((i,)) for i in ids])


# This subsystem's flags (gateway/base/options.py); their defaults are the config's above.
OPTIONS = (
    Option("--disable-fast-tokenizer", "tokenizer.fast_bpe", "disable", "always encode with tokenizers, even where "
           "tiktoken's BPE is identical", "performance"),
    Option("--disable-fast-detokenizer", "tokenizer.fast_decode", "disable", "always detokenize with tokenizers' "
           "DecodeStream, even where the byte table decodes identically", "performance"),
    Option("--disable-fast-chat-template", "tokenizer.fast_chat_template", "disable", "always render chat templates "
           "with Jinja2, even where MiniJinja renders them identically", "performance"),
    Option("--encode-threads", "tokenizer.encode_threads", int, "threads encoding texts over 48 Ki characters (and "
           "long ones without the fast encoder), each with its own ~56 MB encoder, made when the first such text "
           "comes (0: one per core, divided among the --workers processes)", "performance"),
    Option("--chat-template-fuel", "tokenizer.chat_template_fuel", int, "instructions one MiniJinja render may run "
           "before the request fails (default 10,000,000)", "performance"),
    Option("--tokenizer-cache-l0-entries", "tokenizer.l0_entries_max", int, "exact-text cache (L0, texts L1 cannot "
           "hold): entries; 0 turns it off", "performance"),
    Option("--tokenizer-cache-l0-bytes", "tokenizer.l0_bytes_max", int, "exact-text cache (L0): size in bytes",
           "performance"),
    Option("--tokenizer-cache-l1-bytes", "tokenizer.l1_bytes_max", int, "prefix cache (L1, prefixes ending at a "
           "special token): size in bytes; 0 turns it off", "performance"),
)
