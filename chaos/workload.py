"""The workload: OpenAI SDK clients through the load balancer, recording every request's fate.

Threads, each with its own seeded RNG and API key, send chat requests in a
closed loop: non-streaming, streaming, three-turn conversations (each turn
carries the whole conversation so far, as chat clients do), and two-turn
Responses API chains (the second turn names the first by previous_response_id,
so it needs the cluster's stored copy, wherever the balancer sends it). Every
stored response the cluster acknowledged (a 200) is remembered with its text
for the stored-responses check. One key, the hot key, is sent by several
threads at once, above its per-key limit, so rate limiting works throughout the
run; the others stay under theirs. With several models (``models``), each request asks for one of them,
chosen by the thread's RNG, and its record says which.
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time

import openai

from .scenarios import HOT_API_KEY

MODEL = "qwen3-sim"  # the model of a cluster with one
REQUEST_TIMEOUT_S = 60.0


@dataclasses.dataclass(frozen=True)
class StoredRecord:
    """A response the cluster acknowledged storing: it must be found, unchanged, after the run."""

    response_id: str
    api_key: str
    text: str
    acknowledged_at: float  # time.monotonic()


@dataclasses.dataclass
class RequestRecord:
    kind: str  # chat, stream, turn, response
    api_key: str
    start: float  # time.monotonic()
    end: float
    outcome: str  # ok, rate_limited, error
    error: str = ""
    model: str = MODEL
    status: int | None = None  # the HTTP status of an error answered with one

    @property
    def duration_s(self) -> float:
        return self.end - self.start


class Workload:
    def __init__(self, base_url: str, seed: int, hot_threads: int = 3, other_threads: int = 4,
                 models: "list[str] | None" = None) -> None:
        self.base_url = base_url
        self.seed = seed
        self.models = models or [MODEL]
        self.records: list[RequestRecord] = []
        self.stored: list[StoredRecord] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        keys = [HOT_API_KEY] * hot_threads + [f"chaos-user-{i}" for i in range(other_threads)]
        self._threads = [threading.Thread(target=self._loop, args=(i, key), daemon=True, name=f"workload-{i}")
                         for i, key in enumerate(keys)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(REQUEST_TIMEOUT_S + 5)

    def snapshot(self) -> list[RequestRecord]:
        with self._lock:
            return list(self.records)

    def stored_snapshot(self) -> list[StoredRecord]:
        with self._lock:
            return list(self.stored)

    def _record(self, record: RequestRecord) -> None:
        with self._lock:
            self.records.append(record)

    def _loop(self, index: int, api_key: str) -> None:
        rng = random.Random(self.seed * 1000 + index)
        client = openai.OpenAI(base_url=self.base_url + "/v1", api_key=api_key, max_retries=0,
                               timeout=REQUEST_TIMEOUT_S)
        hot = api_key == HOT_API_KEY
        n = 0
        while not self._stop.is_set():
            n += 1
            roll = rng.random()
            topic = f"thread {index} request {n} about {rng.choice(['rivers', 'engines', 'maps', 'tea'])}"
            model = self.models[rng.randrange(len(self.models))]
            if roll < 0.45:
                self._one(client, api_key, model, "chat", [{"role": "user", "content": topic}], stream=False)
            elif roll < 0.7:
                self._one(client, api_key, model, "stream", [{"role": "user", "content": topic}], stream=True)
            elif roll < 0.85:
                previous = self._response(client, api_key, model, topic, None)
                if previous is not None:
                    self._response(client, api_key, model, f"{topic}, go on", previous)
            else:
                messages = [{"role": "system", "content": "You are a terse assistant shared by every thread."}]
                for turn in range(3):
                    messages.append({"role": "user", "content": f"{topic}, turn {turn}"})
                    answer = self._one(client, api_key, model, "turn", messages, stream=False)
                    if answer is None:
                        break
                    messages.append({"role": "assistant", "content": answer})
            if not hot:
                self._stop.wait(0.05 + 0.1 * rng.random())

    def _response(self, client: openai.OpenAI, api_key: str, model: str, text: str, previous: str | None
                  ) -> str | None:
        """One stored Responses API turn (after ``previous``); its id once the cluster acknowledged it."""
        start = time.monotonic()
        try:
            response = client.responses.create(model=model, input=text, max_output_tokens=16,
                                               previous_response_id=previous or openai.omit)
        except openai.RateLimitError:
            self._record(RequestRecord("response", api_key, start, time.monotonic(), "rate_limited", model=model))
            return None
        except openai.APIError as e:  # the code first: the checkers read it (history_unavailable)
            self._record(_failure("response", api_key, model, start, e))
            return None
        now = time.monotonic()
        with self._lock:
            self.records.append(RequestRecord("response", api_key, start, now, "ok", model=model))
            self.stored.append(StoredRecord(response.id, api_key, response.output_text, now))
        return response.id

    def _one(self, client: openai.OpenAI, api_key: str, model: str, kind: str, messages: list, stream: bool
             ) -> str | None:
        start = time.monotonic()
        try:
            if stream:
                parts = []
                for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=16,
                                                            stream=True):
                    if chunk.choices:
                        parts.append(chunk.choices[0].delta.content or "")
                text = "".join(parts)
            else:
                text = client.chat.completions.create(model=model, messages=messages,
                                                      max_tokens=16).choices[0].message.content
            self._record(RequestRecord(kind, api_key, start, time.monotonic(), "ok", model=model))
            return text
        except openai.RateLimitError:
            self._record(RequestRecord(kind, api_key, start, time.monotonic(), "rate_limited", model=model))
        except openai.APIError as e:
            self._record(_failure(kind, api_key, model, start, e))
        return None


def _failure(kind: str, api_key: str, model: str, start: float, e: openai.APIError) -> RequestRecord:
    """A failed request's record: the error's class, code and message (the checkers read the code, e.g.
    history_unavailable, and the message: a model's outage must name the model), and its status."""
    return RequestRecord(kind, api_key, start, time.monotonic(), "error",
                         f"{type(e).__name__} [{getattr(e, 'code', None)}]: {str(e)[:200]}", model=model,
                         status=getattr(e, "status_code", None))
