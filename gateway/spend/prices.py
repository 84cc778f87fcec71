"""What a request costs: the prices of the models config and the usage a request reports. No I/O.

Prices are US dollars per million tokens, as providers publish them, plus a price per request where a provider
charges one. A target of the models config (``gateway/providers/routes.py``) and a route (the price of its pool
targets, and of any target without one of its own) may say::

    price_usd_per_mtok = { input = 3.0, cached_input = 0.3, output = 15.0, reasoning = 15.0 }
    price_usd_per_request = 0.0

Every price defaults to zero; ``cached_input`` to ``input`` and ``reasoning`` to ``output`` (what a provider
that does not price them apart charges). Usage counts as OpenAI's does: the prompt's tokens include those read
from a cache, the completion's those spent reasoning, so

    cost = (prompt - cached) * input + cached * cached_input
         + (completion - reasoning) * output + reasoning * reasoning + request

A request cut off (a client gone, a timeout) costs what was generated until then: its usage says so.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

MTOK = 1_000_000
PRICE_USD_MAX = 1e6  # per million tokens or per request: anything above is a typo, not a price
_TOKEN_PRICES = ("input", "cached_input", "output", "reasoning")


class PriceError(ValueError):
    """A price that cannot be used (the message names the field)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Price:
    input_usd_per_mtok: float = 0.0
    cached_input_usd_per_mtok: float = 0.0
    output_usd_per_mtok: float = 0.0
    reasoning_usd_per_mtok: float = 0.0
    request_usd: float = 0.0

    @property
    def free(self) -> bool:
        return not (self.input_usd_per_mtok or self.cached_input_usd_per_mtok or self.output_usd_per_mtok
                    or self.reasoning_usd_per_mtok or self.request_usd)

    def cost_usd(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0,
                 reasoning_tokens: int = 0) -> float:
        cached = min(max(0, cached_tokens), prompt_tokens)
        reasoning = min(max(0, reasoning_tokens), completion_tokens)
        return ((prompt_tokens - cached) * self.input_usd_per_mtok + cached * self.cached_input_usd_per_mtok
                + (completion_tokens - reasoning) * self.output_usd_per_mtok
                + reasoning * self.reasoning_usd_per_mtok) / MTOK + self.request_usd

    def estimate_usd(self, prompt_tokens: int, output_tokens: int) -> float:
        """The most a request may cost, to reserve before it runs: its prompt at the input price (no cache hit
        assumed), every output token at the dearer of output and reasoning."""
        dearest_output = max(self.output_usd_per_mtok, self.reasoning_usd_per_mtok)
        return (prompt_tokens * self.input_usd_per_mtok + output_tokens * dearest_output) / MTOK + self.request_usd

    def to_dict(self) -> dict[str, Any]:
        return {"price_usd_per_mtok": {"input": self.input_usd_per_mtok, "cached_input": self.cached_input_usd_per_mtok,
                                       "output": self.output_usd_per_mtok, "reasoning": self.reasoning_usd_per_mtok},
                "price_usd_per_request": self.request_usd}


FREE = Price()


def _amount(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 <= value <= PRICE_USD_MAX:
        raise PriceError(f"{where} must be a number of dollars from 0 to {PRICE_USD_MAX:g}, not {value!r}")
    return float(value)


def parse_price(spec: Any, where: str) -> Price | None:
    """The price a target's or route's table states (``price_usd_per_mtok``, ``price_usd_per_request``), or None
    when it states none."""
    per_mtok = spec.get("price_usd_per_mtok")
    per_request = spec.get("price_usd_per_request")
    if per_mtok is None and per_request is None:
        return None
    per_mtok = per_mtok if per_mtok is not None else {}
    if not isinstance(per_mtok, dict):
        raise PriceError(f"{where}.price_usd_per_mtok is a table of {', '.join(_TOKEN_PRICES)}")
    unknown = set(per_mtok) - set(_TOKEN_PRICES)
    if unknown:
        raise PriceError(f"{where}.price_usd_per_mtok has unknown keys: {', '.join(sorted(map(str, unknown)))}")
    values = {name: _amount(per_mtok[name], f"{where}.price_usd_per_mtok.{name}") for name in per_mtok}
    input_price = values.get("input", 0.0)
    output_price = values.get("output", 0.0)
    return Price(input_price, values.get("cached_input", input_price), output_price,
                 values.get("reasoning", output_price),
                 _amount(per_request, f"{where}.price_usd_per_request") if per_request is not None else 0.0)
