"""What a prefill or a decode engine does beyond a regular one, for both services (SGLang and vLLM).

SGLang's contract: the gateway sends one request to both engines at once with the same
``disaggregated_params`` (bootstrap host, port and room). The prefill engine computes the prompt,
offers its KV under the room and answers once a decode took it; the decode engine fetches the
room from ``bootstrap_host:bootstrap_port`` and only then produces tokens.

vLLM's contract (as its own PD proxy drives it): the gateway sends the prefill first with
``kv_transfer_params`` ``{"do_remote_decode": true}``; the prefill computes the prompt, keeps the
KV and answers with the parameters a decode needs (``do_remote_prefill``, ``remote_host``,
``remote_port``, ``remote_engine_id``, ``remote_block_ids``, ``remote_request_id``); the decode
gets those parameters and fetches the KV before producing tokens.

The hand-over itself is ``handover.py``. A decode engine never computes a prompt on its own: a
request without a hand-over fails (FAILED_PRECONDITION), so a gateway that skips the prefill, or
sends the two engines different rooms, fails as it would against real engines.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import uuid

import grpc

from .config import SimEngineConfig
from .core import EngineOverloaded, GenerateParams, Step
from .handover import HandoverBoard, HandoverFailed, fetch, start_bootstrap_server

# "encode": TokenSpeed's encode worker (EPD: tokenspeed_encoder.proto), serving only Encode; it hands each encoded
# item over on its bootstrap port as a prefill hands KV over (encode_stage.py).
ROLES = ("regular", "prefill", "decode", "encode")

log = logging.getLogger("chaos.sim_engine")


class Disaggregation:
    def __init__(self, config: SimEngineConfig, host: str) -> None:
        if config.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}")
        self.role = config.role
        self.timeout_s = config.handover_timeout_s
        self.pairing_protocol = config.pairing_protocol
        self.engine_id = uuid.uuid4().hex  # vLLM's kv_transfer_config.engine_id: who the KV belongs to
        self.host = host
        self.bootstrap_port = config.bootstrap_port
        self.board = HandoverBoard(config.handover_timeout_s) if self.role in ("prefill", "encode") else None
        self._keys: dict[str, str] = {}  # request id -> the hand-over key it offered (for Abort)
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        """A prefill engine's bootstrap server (where decodes fetch KV); an encode engine's (where prefills fetch
        encoded items)."""
        if self.board is None:
            return
        self._server = await start_bootstrap_server(self.board, self.host, self.bootstrap_port)
        self.bootstrap_port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()

    def abort(self, request_ids: "list[str]") -> None:
        """An aborted prefill's KV is not offered any more."""
        if self.board is None:
            return
        for request_id in request_ids:
            key = self._keys.pop(request_id, None)
            log.info("prefill of request %s aborted%s", request_id, f": the KV of {key} is freed" if key else "")
            if key is not None:
                self.board.withdraw(key)

    async def prefill(self, shared, params: GenerateParams, key: str, context) -> Step:
        """Compute the prompt (a prefill engine answers one token) and offer its KV under ``key``."""
        last = None
        async for step in shared.run(dataclasses.replace(params, max_tokens=1), context):
            last = step
        try:
            self.board.offer(key, params.prompt_ids)
        except HandoverFailed as e:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, str(e))
        self._keys[params.request_id] = key
        return last

    async def wait_decode(self, params: GenerateParams, key: str, context) -> None:
        """SGLang: the prefill answers once a decode took its KV (ABORTED if none did in time)."""
        try:
            await self.board.wait_taken(key)
        except HandoverFailed as e:
            await context.abort(grpc.StatusCode.ABORTED, str(e))
        finally:
            self._keys.pop(params.request_id, None)

    def keep_for_decode(self, params: GenerateParams, key: str) -> str:
        """vLLM: the prefill answers now and keeps the KV until fetched (or freed after the timeout); the
        parameters its answer carries, as JSON."""
        self.board.expire_later(key, on_end=lambda: self._keys.pop(params.request_id, None))
        self._keys[params.request_id] = key  # an Abort of the request frees the KV it keeps
        return json.dumps({"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": self.engine_id,
                           "remote_block_ids": list(range(max(1, len(params.prompt_ids) // 16))),
                           "remote_host": self.host, "remote_port": self.bootstrap_port, "remote_request_id": key,
                           "tp_size": 1})

    async def receive(self, shared, params: GenerateParams, host: str, port: int, key: str,
                      context) -> GenerateParams:
        """The decode's side: the KV of ``key`` from the prefill at ``host:port``, then the parameters to decode
        with (no prefill cost). Room for the request first, as a real decode engine reserves KV before the transfer."""
        try:
            shared.engine.check_admission()
        except EngineOverloaded as e:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
        try:
            await fetch(host, port, key, params.prompt_ids, self.timeout_s)
        except HandoverFailed as e:
            await context.abort(grpc.StatusCode.ABORTED, str(e))
        return dataclasses.replace(params, prefilled=True)

    # SGLang's request fields (``disaggregated_params``), TokenSpeed's (``kv_bootstrap_info``).
    async def room_key(self, request, field: str, context) -> "tuple[str, str, int] | None":
        """(room key, bootstrap host, port) of a prefill or decode engine's request, from its ``field``; None on a
        regular engine."""
        if self.role == "regular":
            return None
        if not request.HasField(field):
            await context.abort(*self._missing(f"{field} (bootstrap_host, bootstrap_port, bootstrap_room)"))
        dp = getattr(request, field)
        return f"room-{dp.bootstrap_room}", dp.bootstrap_host, dp.bootstrap_port

    # vLLM's request fields.
    async def vllm_params(self, request, context) -> "dict | None":
        """The request's kv_transfer_params, checked for this engine's role; None on a regular engine."""
        if self.role == "regular":
            return None
        if not request.HasField("kv_transfer_params_json"):
            await context.abort(*self._missing("kv_transfer_params"))
        try:
            params = json.loads(request.kv_transfer_params_json)
            if not isinstance(params, dict):
                raise ValueError("not an object")
            if self.role == "decode":
                params["remote_port"] = int(params["remote_port"])
                str(params["remote_host"]), str(params["remote_request_id"])
        except (ValueError, KeyError, TypeError) as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"kv_transfer_params: {e}")
        wanted = "do_remote_decode" if self.role == "prefill" else "do_remote_prefill"
        if not params.get(wanted):
            await context.abort(*self._missing(f"kv_transfer_params with {wanted}"))
        return params

    def _missing(self, what: str) -> "tuple[grpc.StatusCode, str]":
        if self.role == "decode":
            return (grpc.StatusCode.FAILED_PRECONDITION,
                    f"this is a decode engine: it decodes only prompts a prefill engine handed over ({what})")
        return grpc.StatusCode.INVALID_ARGUMENT, f"this is a prefill engine: a request needs {what}"

    def statistics(self) -> dict:
        board = self.board
        return {"role": self.role, "handed_over": board.handed_over_total if board else 0,
                "expired": board.expired_total if board else 0, "refused": board.refused_total if board else 0}
