"""One registry per pluggable kind: tool-call and reasoning parsers, routing policies,
history backends, image processors, engine kinds.

A kind's members register themselves in their own module (``REGISTRY.add(name, make, summary, ...)``), and
everything that lists or chooses them reads the registry: the config's check of a flag's value and the
choices it names, ``--help``, the docs' tables (``markdown_table``; a test holds the docs to them), and
whatever picks one by name (the parser choice by model id, the server opening a history backend). Adding a
member is then its module, its tests and the docs' line, and nothing that lists it can miss it.

A member has one name (smg's, where smg has it) and may have aliases (vLLM's and SGLang's names for the
same thing); a lookup by either finds it. ``details`` are the kind's own fields (a parser's format and the
models that use it, a backend's options), kept as the member declared them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Plugin(Generic[T]):
    name: str
    make: T  # what the kind's users call or use: a class, a factory, a backend description
    summary: str  # one line: what it is (--help, the docs)
    aliases: tuple[str, ...] = ()
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def detail(self, key: str, default: Any = None) -> Any:
        return self.details.get(key, default)


class Registry(Generic[T]):
    def __init__(self, kind: str, off: "tuple[str, ...]" = ()) -> None:
        self.kind = kind  # as error messages say it: "tool-call parser", "history backend"
        self.off = off  # names that mean "none of them" (smg's "passthrough", "none"), accepted by check()
        self._plugins: dict[str, Plugin[T]] = {}  # by name, in registration order
        self._by_any_name: dict[str, Plugin[T]] = {}  # names and aliases

    def add(self, name: str, make: T, summary: str, *, aliases: "tuple[str, ...]" = (), **details: Any) -> T:
        """Register ``make`` under ``name`` (and its aliases); returns ``make``. A name taken twice is a bug."""
        plugin = Plugin(name, make, summary, tuple(aliases), details)
        for key in (name, *aliases):
            if key in self._by_any_name or key in self.off:
                raise ValueError(f"the {self.kind} name {key!r} is taken")
            self._by_any_name[key] = plugin
        self._plugins[name] = plugin
        return make

    def registers(self, name: str, summary: str, **options: Any) -> Callable[[T], T]:
        """``add`` as a decorator."""
        return lambda make: self.add(name, make, summary, **options)

    # -- lookups --------------------------------------------------------------------------------------------

    def __getitem__(self, name: str) -> T:
        """What ``name`` (or an alias) makes; KeyError for a name nobody registered."""
        return self._by_any_name[name].make

    def get(self, name: str | None, default: Any = None) -> Any:
        plugin = self._by_any_name.get(name) if name is not None else None
        return plugin.make if plugin is not None else default

    def __contains__(self, name: object) -> bool:
        return name in self._by_any_name

    def __iter__(self) -> Iterator[str]:
        """Every name a lookup accepts, aliases included."""
        return iter(self._by_any_name)

    def __len__(self) -> int:
        return len(self._by_any_name)

    def plugin(self, name: str) -> Plugin[T]:
        return self._by_any_name[name]

    def plugins(self) -> list[Plugin[T]]:
        """The members, one each (not their aliases), in the order they registered."""
        return list(self._plugins.values())

    def names(self) -> list[str]:
        """The members' own names, in the order they registered."""
        return list(self._plugins)

    # -- what people read ---------------------------------------------------------------------------------

    def choices(self) -> str:
        """The names to choose from, as --help and error messages list them (aliases left to the docs)."""
        return ", ".join([*self._plugins, *self.off])

    def check(self, name: str | None, flag: str) -> str | None:
        """Why ``name`` is not a usable value of ``flag`` (None when it is, or when nothing is asked for)."""
        if name is None or name in self._by_any_name or name in self.off:
            return None
        return f"{flag}: unknown {self.kind} {name!r}; choose one of {self.choices()}"

    def markdown_table(self, header: "tuple[str, ...]", row: "Callable[[Plugin[T]], tuple[str, ...]]") -> str:
        """The docs' table of the members: ``header`` and one ``row(plugin)`` per member."""
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row(plugin)) + " |" for plugin in self._plugins.values()]
        return "\n".join(lines)


def named(plugin: Plugin[Any]) -> str:
    """A member's name for a docs table: `name` (`alias`, ...)."""
    aliases = f" ({', '.join(f'`{a}`' for a in plugin.aliases)})" if plugin.aliases else ""
    return f"`{plugin.name}`{aliases}"
