"""Chat templates: the Jinja2 program in tokenizer_config.json, rendered in a sandbox.

A template comes from a model's files, which an operator may not have read, so
it runs in Jinja2's ``ImmutableSandboxedEnvironment`` (no attribute access to
internals, no mutation of our objects). The environment matches what Hugging
Face ``transformers`` gives templates (``trim_blocks``, ``lstrip_blocks``,
``loopcontrols``, ``tojson`` without ASCII escaping, ``raise_exception``,
``strftime_now``), since real templates depend on exactly these.

Jinja2 is the reference. Where MiniJinja renders a template exactly as Jinja2 does on a
battery of conversations (fast_template.py), it renders the requests, 2-5x faster, and
hands every failure back to Jinja2.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .fast_template import FastTemplate, NotEquivalent, OutOfFuel
from .template_globals import TemplateError, raise_exception, strftime_now, tojson

__all__ = ["ChatTemplate", "TemplateError"]

log = logging.getLogger("gateway.tokenizer")


class _Sandbox(ImmutableSandboxedEnvironment):
    """Jinja2's immutable sandbox, remembering its verdict on each (type, attribute name).

    The sandbox asks is_safe_attribute on every attribute a template reads (``message.content``,
    ``content.startswith``...), nine times per render of Qwen3's template, and each answer walks
    isinstance checks against abstract base classes: ~20 of the ~80 µs a render costs. In Jinja2 3.x
    the verdict depends only on the object's type (is_internal_attribute, modifies_known_mutable) and
    the attribute's name, never on the value, so it is kept; the dictionary is bounded because a
    template can build attribute names from data.
    """

    VERDICTS_MAX = 4096

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._verdicts: dict[tuple[type, str], bool] = {}

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        key = (type(obj), attr)
        verdict = self._verdicts.get(key)
        if verdict is None:
            verdict = super().is_safe_attribute(obj, attr, value)
            if len(self._verdicts) < self.VERDICTS_MAX:
                self._verdicts[key] = verdict
        return verdict


@functools.lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


class ChatTemplate:
    def __init__(self, source: str, special_tokens: dict[str, str | None], fast: bool = True,
                 fuel: int | None = None) -> None:
        try:
            self._template = _compile(source)
        except jinja2.TemplateSyntaxError as e:
            raise ValueError(f"chat template does not compile: {e}") from e
        self.source = source
        # bos_token, eos_token, ... as templates expect them in their context.
        self._special = special_tokens
        self.fast: FastTemplate | None = None
        self.fast_refusal = "disabled (--disable-fast-chat-template)"
        self.fast_failures = 0  # renders MiniJinja handed back to Jinja2
        if fast:
            try:
                self.fast = FastTemplate.build(source, special_tokens, self._render_jinja, fuel)
                self.fast_refusal = ""
            except NotEquivalent as e:
                self.fast_refusal = str(e)
                log.info("chat template renders with Jinja2 (MiniJinja not identical: %s)", e)

    def render(self, messages: "list[dict[str, Any]]", *, add_generation_prompt: bool = True,
               tools: "list[dict[str, Any]] | None" = None, **kwargs: Any) -> str:
        if self.fast is not None:
            try:
                return self.fast.render(messages, add_generation_prompt=add_generation_prompt, tools=tools, **kwargs)
            except OutOfFuel as e:
                raise TemplateError(str(e)) from None
            except Exception:  # noqa: BLE001 - Jinja2 decides: its text, or its error for the client
                self.fast_failures += 1
        return self._render_jinja(messages, add_generation_prompt=add_generation_prompt, tools=tools, **kwargs)

    def _render_jinja(self, messages: "list[dict[str, Any]]", *, add_generation_prompt: bool = True,
                      tools: "list[dict[str, Any]] | None" = None, **kwargs: Any) -> str:
        try:
            return self._template.render(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                         **self._special, **kwargs)
        except TemplateError:
            raise
        except jinja2.exceptions.SecurityError as e:
            raise TemplateError(f"chat template tried something the sandbox forbids: {e}") from e
        except (jinja2.TemplateError, TypeError, ValueError, AttributeError, KeyError, IndexError) as e:
            raise TemplateError(f"chat template failed on these messages: {e}") from e
