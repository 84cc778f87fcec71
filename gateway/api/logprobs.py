"""Log probabilities in OpenAI's shapes, from the engine's (token id, logprob, alternatives) entries.

Chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}``.
Completions: ``{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}``, the
prompt's tokens first with ``echo`` (the first of them has a null logprob).

Special tokens the text leaves out (EOS, end of turn) are left out here too. A token's ``bytes`` are
exactly what it writes: a byte-level token holding part of a UTF-8
character gives those bytes, and its ``token`` string is then OpenAI's ``bytes:\\xe2\\x80`` spelling
(the string alone cannot hold half a character). Streamed, each chunk carries the entries of the
tokens that arrived since the last chunk (``LogprobRecord.unsent``).
"""

from __future__ import annotations

from typing import Any

from ..serving.generation import LogprobRecord
from ..tokenizer.service import TokenizerService

class LogprobShape:
    def __init__(self, record: LogprobRecord, tokenizer: TokenizerService, chat: bool, top: int) -> None:
        self.record = record
        self.tokenizer = tokenizer
        # Every generated token has its entry, the special ones the text leaves out too (the end of sequence that
        # stopped it, an end of turn): vLLM's server lists them (checked on vLLM 0.32: "<|im_end|>" with its
        # logprob where the content is "").
        self.chat = chat
        self.top = top
        self._offset = 0  # completions: where the next token's text starts in the answer
        self._texts: dict[int, tuple[str, list[int]]] = {}  # token id -> (token string, bytes), per response

    def _token(self, token_id: int) -> tuple[str, list[int]]:
        known = self._texts.get(token_id)
        if known is None:
            data = self.tokenizer.token_bytes(token_id)
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                text = "bytes:" + "".join(f"\\x{b:02x}" for b in data)
            known = self._texts[token_id] = (text, list(data))
        return known

    def unsent(self, echo: bool = False) -> "dict[str, Any] | None":
        """The entries of the tokens since the last chunk (a stream's chunk); the prompt's first with ``echo``
        (the first chunk of an echoed completion)."""
        return self._shape(self.record.unsent(), self.record.prompt if echo else None)

    def whole(self, echo: bool = False) -> "dict[str, Any] | None":
        """Every entry (a non-streamed answer); the prompt's first with ``echo``."""
        return self._shape(self.record.tokens, self.record.prompt if echo else None)

    def _shape(self, entries: "list[Any] | tuple[Any, ...]", prompt: "tuple[Any, ...] | None"
               ) -> "dict[str, Any] | None":
        if self.chat:
            return {"content": [self._chat_entry(entry) for entry in entries]}
        if prompt:
            entries = [*prompt, *entries]
        tokens, values, tops, offsets = [], [], [], []
        for token_id, logprob, alternatives in entries:
            text = self._token(token_id)[0]
            tokens.append(text)
            values.append(logprob)
            tops.append({self._token(i)[0]: v for i, v in alternatives[:self.top]} if logprob is not None else None)
            offsets.append(self._offset)
            self._offset += len(text)
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}

    def _chat_entry(self, entry: Any) -> dict[str, Any]:
        token_id, logprob, alternatives = entry
        text, data = self._token(token_id)
        top = []
        for alt_id, alt_logprob in alternatives[:self.top]:
            alt_text, alt_data = self._token(alt_id)
            top.append({"token": alt_text, "logprob": alt_logprob, "bytes": alt_data})
        return {"token": text, "logprob": logprob, "bytes": data, "top_logprobs": top}
