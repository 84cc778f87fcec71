"""Constrained answers: text that satisfies a request's JSON schema, regex or choice.

A real engine masks its logits so that only tokens keeping the output valid can be sampled; the
simulated one has no logits, so it writes a valid answer directly and streams its tokens. The
answer is deterministic for a seed, so tests can rely on it, and it is valid by construction:
an instance built from the schema (required properties, enums, consts, bounds, ``$ref`` to
``$defs``, ``anyOf``/``oneOf``, string patterns), a string built from the regex's parse tree
(Python's ``re`` parser: the engines' regex dialects agree with it on what tests use), one of
the choices. Grammars (EBNF) and structural tags are refused with a clear error: writing
a sentence of an arbitrary grammar is the engine's job, not this simulation's.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

try:  # Python 3.11+: the parser lives in re._parser (sre_parse is a deprecated alias of it)
    from re import _parser as sre_parse
    from re import _constants as sre_constants
except ImportError:  # pragma: no cover - older Pythons
    import sre_constants  # type: ignore[no-redef]
    import sre_parse  # type: ignore[no-redef]

WORDS = ("alpha", "bravo", "cedar", "delta", "ember", "fjord", "grove", "harbor", "island", "juniper",
         "kestrel", "lumen", "meadow", "nectar", "orchid", "pebble", "quartz", "river", "summit", "tundra")
REPEAT_EXTRA_MAX = 2  # an open-ended repeat (*, +, {n,}) runs at most this many times past its minimum
SCHEMA_DEPTH_MAX = 64


class UnsupportedConstraint(ValueError):
    """A constraint the simulated engine cannot honour (a grammar, a structural tag, a broken spec)."""


def constrained_text(kind: str, spec: Any, seed: int) -> str:
    """A valid answer for the constraint ``kind`` (json_schema, json_object, regex, choice)."""
    rng = random.Random(seed)
    if kind == "choice":
        return rng.choice(list(spec))
    if kind == "regex":
        return regex_example(spec, rng)
    if kind == "json_object":
        return json.dumps({"answer": _words(rng, 2)})
    if kind == "json_schema":
        try:
            schema = json.loads(spec)
        except ValueError as e:
            raise UnsupportedConstraint(f"the JSON schema is not valid JSON: {e}") from None
        return json.dumps(SchemaExample(schema, rng).value(schema, 0), ensure_ascii=False)
    raise UnsupportedConstraint(f"the simulated engine does not honour {kind} constraints")


def _words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


class SchemaExample:
    """An instance of a JSON schema (the parts of draft 2020-12 that structured output uses)."""

    def __init__(self, root: Any, rng: random.Random) -> None:
        self.root = root
        self.rng = rng

    def value(self, schema: Any, depth: int) -> Any:
        if depth > SCHEMA_DEPTH_MAX:
            raise UnsupportedConstraint("the JSON schema nests too deeply (or refers to itself without end)")
        if schema is True or schema == {}:
            return _words(self.rng, 1)
        if not isinstance(schema, dict):
            raise UnsupportedConstraint(f"not a schema: {schema!r}")
        if "$ref" in schema:
            return self.value(self._resolve(schema["$ref"]), depth + 1)
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            return self.rng.choice(schema["enum"])
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return self.value(self.rng.choice(schema[key]), depth + 1)
        if "allOf" in schema:
            merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
            for part in schema["allOf"]:
                part = self._resolve(part["$ref"]) if isinstance(part, dict) and "$ref" in part else part
                for k, v in part.items():
                    if k == "properties":
                        merged[k] = {**merged.get(k, {}), **v}
                    elif k == "required":
                        merged[k] = [*merged.get(k, []), *v]
                    else:
                        merged[k] = v
            return self.value(merged, depth + 1)
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "null")
        if kind is None:
            kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
        return getattr(self, "_" + kind)(schema, depth)

    def _resolve(self, ref: str) -> Any:
        if not ref.startswith("#"):
            raise UnsupportedConstraint(f"only local $refs are supported, not {ref!r}")
        node = self.root
        for part in ref[1:].split("/")[1:]:
            try:
                node = node[part.replace("~1", "/").replace("~0", "~")]
            except (KeyError, TypeError):
                raise UnsupportedConstraint(f"$ref {ref!r} points nowhere") from None
        return node

    def _object(self, schema: dict[str, Any], depth: int) -> dict[str, Any]:
        properties = schema.get("properties", {})
        names = list(schema.get("required", []))
        names += [n for n in properties if n not in names and self.rng.random() < 0.5]
        minimum = schema.get("minProperties", 0)
        names += [n for n in properties if n not in names][:max(0, minimum - len(names))]
        out = {name: self.value(properties.get(name, {}), depth + 1) for name in names}
        extra = schema.get("additionalProperties", True)
        index = 0
        while len(out) < minimum and extra is not False:
            out[f"extra_{index}"] = self.value(extra if isinstance(extra, dict) else {}, depth + 1)
            index += 1
        return out

    def _array(self, schema: dict[str, Any], depth: int) -> list[Any]:
        prefix = schema.get("prefixItems", [])
        items = schema.get("items", {})
        low = max(schema.get("minItems", 0), len(prefix))
        high = schema.get("maxItems", low + 2)
        count = max(low, min(high, low + self.rng.randint(0 if low else 1, 2)))
        out = [self.value(prefix[i] if i < len(prefix) else items, depth + 1) for i in range(count)]
        if schema.get("uniqueItems"):
            unique = []
            for value in out:
                if value not in unique:
                    unique.append(value)
            out = unique if len(unique) >= low else out
        return out

    def _string(self, schema: dict[str, Any], depth: int) -> str:
        if "pattern" in schema:
            return regex_example(schema["pattern"], self.rng)  # what fullmatch accepts, search finds
        formats = {"date-time": "2026-11-25T12:00:00Z", "date": "2026-11-25", "time": "12:00:00",
                   "email": "user@example.com", "uuid": "3f2b8c1e-7d4a-4b6e-9a10-2c5d8e7f6a31",
                   "uri": "https://example.com/", "ipv4": "192.0.2.1", "hostname": "example.com"}
        if schema.get("format") in formats:
            return formats[schema["format"]]
        text = _words(self.rng, 2)
        low, high = schema.get("minLength", 0), schema.get("maxLength")
        while len(text) < low:
            text += self.rng.choice(WORDS)
        return text if high is None else text[:high]

    def _integer(self, schema: dict[str, Any], depth: int) -> int:
        low = schema.get("minimum", schema["exclusiveMinimum"] + 1 if "exclusiveMinimum" in schema else 0)
        high = schema.get("maximum", schema["exclusiveMaximum"] - 1 if "exclusiveMaximum" in schema else low + 100)
        low, high = int(-(-low // 1)), int(high // 1)
        step = schema.get("multipleOf", 1)
        step = step if isinstance(step, int) and step > 0 else 1
        first = -(-low // step) * step  # the first multiple of step from low
        return first + step * self.rng.randint(0, max(0, (high - first) // step))

    def _number(self, schema: dict[str, Any], depth: int) -> float:
        return float(self._integer(schema, depth))

    def _boolean(self, schema: dict[str, Any], depth: int) -> bool:
        return self.rng.random() < 0.5

    def _null(self, schema: dict[str, Any], depth: int) -> None:
        return None


def regex_example(pattern: str, rng: random.Random) -> str:
    """A string the whole pattern matches (``re.fullmatch``)."""
    try:
        tree = sre_parse.parse(pattern)
    except re.error as e:
        raise UnsupportedConstraint(f"invalid regex {pattern!r}: {e}") from None
    groups: dict[int, str] = {}
    return _emit(tree, rng, groups)


_CATEGORY_EXAMPLES = {
    sre_constants.CATEGORY_DIGIT: "7", sre_constants.CATEGORY_NOT_DIGIT: "x",
    sre_constants.CATEGORY_SPACE: " ", sre_constants.CATEGORY_NOT_SPACE: "x",
    sre_constants.CATEGORY_WORD: "w", sre_constants.CATEGORY_NOT_WORD: "-",
}


def _emit(tree: Any, rng: random.Random, groups: dict[int, str]) -> str:
    out = []
    for op, arg in tree:
        if op is sre_constants.LITERAL:
            out.append(chr(arg))
        elif op is sre_constants.NOT_LITERAL:
            out.append("x" if chr(arg) != "x" else "y")
        elif op is sre_constants.ANY:
            out.append(rng.choice("abcdefgh"))
        elif op is sre_constants.IN:
            out.append(_in_class(arg, rng))
        elif op is sre_constants.BRANCH:
            out.append(_emit(rng.choice(arg[1]), rng, groups))
        elif op is sre_constants.SUBPATTERN:
            group, _, _, sub = arg
            text = _emit(sub, rng, groups)
            if group is not None:
                groups[group] = text
            out.append(text)
        elif op in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT,
                    getattr(sre_constants, "POSSESSIVE_REPEAT", None)):
            low, high, sub = arg
            high = low + REPEAT_EXTRA_MAX if high is sre_constants.MAXREPEAT else high
            out.extend(_emit(sub, rng, groups) for _ in range(rng.randint(low, max(low, min(high, low + 2)))))
        elif op is sre_constants.GROUPREF:
            out.append(groups.get(arg, ""))
        elif op is sre_constants.AT or op in (sre_constants.ASSERT, sre_constants.ASSERT_NOT):
            continue  # anchors and lookarounds write nothing
        elif op is getattr(sre_constants, "ATOMIC_GROUP", None):
            out.append(_emit(arg, rng, groups))
        else:
            raise UnsupportedConstraint(f"the simulated engine cannot write text for regex element {op}")
    return "".join(out)


def _in_class(items: Any, rng: random.Random) -> str:
    """A character of a [...] class."""
    if items and items[0][0] is sre_constants.NEGATE:
        excluded = set()
        for op, arg in items[1:]:
            if op is sre_constants.LITERAL:
                excluded.add(chr(arg))
            elif op is sre_constants.RANGE:
                excluded.update(chr(c) for c in range(arg[0], arg[1] + 1))
        candidates = [c for c in "abcdefghijklmnopqrstuvwxyz0123456789" if c not in excluded]
        if not candidates:
            raise UnsupportedConstraint("a negated character class excludes every simple character")
        return rng.choice(candidates)
    op, arg = rng.choice(items)
    if op is sre_constants.LITERAL:
        return chr(arg)
    if op is sre_constants.RANGE:
        return chr(rng.randint(arg[0], arg[1]))
    if op is sre_constants.CATEGORY:
        return _CATEGORY_EXAMPLES.get(arg, "x")
    raise UnsupportedConstraint(f"the simulated engine cannot write a character of class element {op}")
