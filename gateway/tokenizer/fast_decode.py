"""Incremental detokenization for byte-level BPE tokenizers from a table of each token's bytes.

``tokenizers``' ``DecodeStream`` re-decodes a window of ids on every step (twice when it
emits), through the Python-Rust boundary: ~3 us per streamed token, and ~20,000
instructions of its byte-level decoder per 16-token answer. For a tokenizer whose decoder is
``ByteLevel`` alone, the text of ids is the UTF-8 decoding (invalid sequences replaced) of
their tokens' bytes joined, so a stream needs only those bytes:

* a token's bytes are its vocabulary string read back through the byte-level alphabet, or
  the string's own UTF-8 when a character is outside that alphabet (an added token such as
  ``<think>`` maps to itself either way), as ``ByteLevel``'s decoder does;
* a step of one id appends its token's bytes to what is held back and emits their decoding
  unless it is empty or ends in U+FFFD, exactly when ``DecodeStream`` emits: what it emitted
  before always ends on a whole character, so the decoding of the window is the earlier text
  followed by the decoding of the new bytes alone; a step of several ids gives what stepping
  them one at a time gives, joined (``DecodeStream`` given them at once holds them all back
  when the last ends inside a character: a whole non-streamed answer would be lost);
* special tokens are dropped when ``skip_special_tokens`` is set; ids the vocabulary does
  not have are dropped (``tokenizers`` filters them the same way).

``ByteLevelDecoder.build`` refuses (``NotEquivalent``) any tokenizer with another decoder, and
checks itself against ``tokenizers`` before use: every id decoded alone (the verdict is kept
per tokenizer.json, like the fast encoder's), and a mixed stream, byte tokens that make invalid
UTF-8 among them, stepped through both, with and without special tokens.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

import orjson
import tokenizers
from tokenizers.decoders import DecodeStream

from .fast_bpe import SELF_CHECK_TEXT, NotEquivalent, _bytes_to_unicode, known_verdict, remember_verdict

# str.translate table: each byte-level character to the latin-1 character of its byte, and every
# other character below 256 (a space, a control character) to one latin-1 cannot encode, so that
# a token holding any character outside the alphabet falls back to its own UTF-8 as a whole.
_ALPHABET = _bytes_to_unicode()
_TO_LATIN1 = {**{c: "\uffff" for c in range(256)}, **{ord(c): b for b, c in _ALPHABET.items()}}
SELF_CHECK_STEPS = 2000
_REPLACEMENT = "\ufffd"


def _token_bytes(token: str) -> bytes:
    try:
        return token.translate(_TO_LATIN1).encode("latin-1")
    except UnicodeEncodeError:  # not byte-level text (an added token with a space, say): its own UTF-8
        return token.encode("utf-8")


class ByteLevelStream:
    """One generation's text, piece by piece; the same pieces as ``DecodeStream``."""

    __slots__ = ("_table", "_size", "_held")

    def __init__(self, table: "list[bytes]") -> None:
        self._table = table
        self._size = len(table)
        self._held = b""  # bytes of an unfinished character (or a trailing invalid sequence)

    def step(self, ids: "list[int] | tuple[int, ...]") -> str:
        """The text these ids end, as stepping them one at a time would give it joined: a batch whose bytes end
        inside a character releases what comes before that character (a non-streamed answer cut by max_tokens
        in the middle of one is its text less that character, as vLLM's per-token detokenizer gives it, not
        nothing)."""
        table, size = self._table, self._size
        if len(ids) == 1:
            i = ids[0]
            data = self._held + (table[i] if 0 <= i < size else b"")
        else:
            data = self._held + b"".join([table[i] for i in ids if 0 <= i < size])
        text = data.decode("utf-8", "replace")
        if not text or text[-1] == _REPLACEMENT:
            if len(ids) > 1:  # (rare: only a batch that ends inside a character) token by token
                return "".join([self.step((i,)) for i in ids])
            self._held = data
            return ""
        self._held = b""
        return text


class ByteLevelDecoder:
    def __init__(self, token_bytes: "list[bytes]", special_ids: "frozenset[int]") -> None:
        self._with_special = token_bytes
        self._without_special = [b"" if i in special_ids else data for i, data in enumerate(token_bytes)]
        self._special_ids = special_ids
        # Tables that skip special tokens but keep some, per set of kept spellings (a parser's markers:
        # a handful of sets per node, each a table of references built once).
        self._keeping: dict[frozenset[str], list[bytes]] = {}

    def token_bytes(self, token_id: int) -> bytes:
        """A token's bytes (part of a UTF-8 character for some byte-level tokens); b"" for an unknown id."""
        table = self._with_special
        return table[token_id] if 0 <= token_id < len(table) else b""

    def new_stream(self, skip_special_tokens: bool, kept_special: "frozenset[str]" = frozenset()) -> ByteLevelStream:
        if not skip_special_tokens:
            return ByteLevelStream(self._with_special)
        if not kept_special:
            return ByteLevelStream(self._without_special)
        table = self._keeping.get(kept_special)
        if table is None:
            spelled = {kept.encode("utf-8") for kept in kept_special}
            table = list(self._without_special)
            for i in self._special_ids:
                if self._with_special[i] in spelled:
                    table[i] = self._with_special[i]
            self._keeping[kept_special] = table
        return ByteLevelStream(table)

    @classmethod
    def build(cls, tokenizer_json: str, reference: tokenizers.Tokenizer,
              spec: "dict[str, Any] | None" = None) -> "ByteLevelDecoder":
        """A decoder identical to ``reference``'s ``DecodeStream``, or NotEquivalent with the reason.

        ``spec`` is ``tokenizer_json`` parsed, when the caller has it (parsing takes ~0.1 s).
        """
        spec = orjson.loads(tokenizer_json) if spec is None else spec
        decoder = spec.get("decoder") or {}
        if decoder.get("type") != "ByteLevel":
            raise NotEquivalent(f"the decoder is {decoder.get('type')!r}, not ByteLevel")
        vocab: dict[str, int] = (spec.get("model") or {}).get("vocab") or {}
        if not isinstance(vocab, dict):
            raise NotEquivalent("the model's vocabulary is not a token-to-id map")
        added = reference.get_added_tokens_decoder()
        table = [b""] * (max([*vocab.values(), *added], default=-1) + 1)
        for token, token_id in vocab.items():
            table[token_id] = _token_bytes(token)
        for token_id, token in added.items():
            table[token_id] = _token_bytes(token.content)
        fast = cls(table, frozenset(i for i, token in added.items() if token.special))
        digest = hashlib.sha256(tokenizer_json.encode("utf-8")).hexdigest()
        if not known_verdict(digest, "decode"):
            _check_every_token(table, reference)
            remember_verdict(digest, "decode", "every token decodes alone as tokenizers decodes it\n")
        _check_streams(fast, reference)
        return fast


def _check_every_token(table: "list[bytes]", reference: tokenizers.Tokenizer) -> None:
    texts = reference.decode_batch([[i] for i in range(len(table))], skip_special_tokens=False)
    for token_id, (data, text) in enumerate(zip(table, texts)):
        if data.decode("utf-8", "replace") != text:
            raise NotEquivalent(f"token {token_id} decodes to {text!r}, its bytes to {data!r}")


def _check_streams(fast: ByteLevelDecoder, reference: tokenizers.Tokenizer) -> None:
    """Steps of one to three ids through ours, against the same ids stepped one at a time through DecodeStream
    (joined per step), compared piece by piece."""
    ids = reference.encode(SELF_CHECK_TEXT, add_special_tokens=False).ids
    rng = random.Random(0)  # fixed: the same check at every start
    byte_tokens = [reference.token_to_id(c) for c in _ALPHABET.values()]
    mixed = [rng.choice(byte_tokens) if rng.random() < 0.3 else rng.choice(ids) for _ in range(SELF_CHECK_STEPS)]
    for skip in (False, True):
        ours, theirs = fast.new_stream(skip), DecodeStream(skip_special_tokens=skip)
        at = 0
        sequence = ids + mixed
        while at < len(sequence):
            step = sequence[at:at + 1 + rng.randrange(3)]
            at += len(step)
            expected = "".join([theirs.step(reference, [i]) or "" for i in step])
            if ours.step(step) != expected:
                raise NotEquivalent(f"a stream differs at id {at} (skip_special_tokens={skip})")
