"""Who spent what: the cluster's spend, by day, API key, tenant, model and target. No I/O.

A row counts requests, tokens (input, of which cached; output, of which reasoning) and dollars for one
(day, key, tenant, model, target). Each node counts the requests it answered in rows of its own (its
*origin*); every node holds every origin's rows, so any node reports the cluster's spend, and one that was lost
took nothing with it (gateway/spend/exchange.py carries them).

An origin's row only grows, so two copies of it merge as the larger of each field, in any order, any number of
times (a grow-only counter: a CRDT). A node restarted without its data directory gets its own rows back from
its peers the same way.

Bounds: rows older than ``retention_days`` are forgotten; beyond ``rows_max`` rows (all origins) the oldest
day's rows go first, counted in ``rows_dropped``. Fields coming from peers are checked (``row_from_wire``).
"""

from __future__ import annotations

import calendar
import dataclasses
import math
import time
from collections.abc import Iterable, Iterator
from typing import Any

# The row's fields: (day "YYYY-MM-DD", key id, tenant, model, target); "" where there is none.
Row = tuple[str, str, str, str, str]
ROW_FIELDS = ("day", "key", "tenant", "model", "target")
VALUE_FIELDS = ("requests", "input_tokens", "cached_tokens", "output_tokens", "reasoning_tokens", "cost_usd")
COST = VALUE_FIELDS.index("cost_usd")
ROW_CHARS_MAX = 256  # each of key, tenant, model, target (longer ones are cut where they are made)
VALUE_MAX = 1e18
DAY_S = 86_400


class BadRows(ValueError):
    """A peer's or the journal's rows that are not rows."""


def day_of(now_s: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(now_s))


def _cut(text: str | None) -> str:
    return text[:ROW_CHARS_MAX] if text else ""


def row_from_wire(item: Any) -> tuple[Row, list[float]]:
    """A row and its values as the wire and the journal carry them: ``[day, key, tenant, model, target,
    requests, input, cached, output, reasoning, cost]``."""
    if not isinstance(item, (list, tuple)) or len(item) != len(ROW_FIELDS) + len(VALUE_FIELDS):
        raise BadRows("a row is a list of 11 fields")
    names, values = item[:len(ROW_FIELDS)], item[len(ROW_FIELDS):]
    if not all(isinstance(n, str) and len(n) <= ROW_CHARS_MAX for n in names) or len(names[0]) != 10:
        raise BadRows("a row's names are strings, its day YYYY-MM-DD")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v <= VALUE_MAX
               for v in values):
        raise BadRows("a row's values are numbers from 0")
    return tuple(names), [float(v) for v in values]  # type: ignore[return-value]


def row_to_wire(row: Row, values: list[float]) -> list[Any]:
    return [*row, *values]


@dataclasses.dataclass(frozen=True)
class LedgerConfig:
    # A year and a month: a monthly report of last year's same month still answers.
    retention_days: int = 400
    # Rows of every origin; ~200 bytes each, so ~40 MiB at the bound.
    rows_max: int = 200_000


class SpendLedger:
    def __init__(self, origin: str, config: LedgerConfig = LedgerConfig()) -> None:
        self.origin = origin
        self.config = config
        self.origins: dict[str, dict[Row, list[float]]] = {origin: {}}
        self.rows = 0
        self.rows_dropped = 0
        self._dirty: set[Row] = set()  # this origin's rows changed since they were last sent
        self._changed: dict[tuple[str, Row], None] = {}  # any origin's rows changed since last journaled
        self._day = ""
        self._day_ends_s = 0.0
        # Dollars by (scope, name, day) over every origin, kept up to date as rows grow: what a budget's owner
        # reconciles its counter with (``spent``). Scope "key" is named by the key's id, "tenant" by the tenant.
        self._spent: dict[tuple[str, str, str], float] = {}

    def today(self, now_s: float) -> str:
        if now_s >= self._day_ends_s or now_s < self._day_ends_s - DAY_S:
            self._day = day_of(now_s)
            self._day_ends_s = (now_s // DAY_S + 1) * DAY_S
        return self._day

    def add(self, now_s: float, key: str | None, tenant: str | None, model: str | None, target: str | None,
            requests: int, input_tokens: int, cached_tokens: int, output_tokens: int, reasoning_tokens: int,
            cost_usd: float) -> None:
        """Answered requests of this node (their sums)."""
        row = (self.today(now_s), _cut(key), _cut(tenant), _cut(model), _cut(target))
        own = self.origins[self.origin]
        values = own.get(row)
        if values is None:
            values = own[row] = [0.0] * len(VALUE_FIELDS)
            self.rows += 1
            if self.rows > self.config.rows_max:
                self._drop_oldest_day()
        if cost_usd:
            self._count_spent(row, cost_usd)
        values[0] += requests
        values[1] += input_tokens
        values[2] += cached_tokens
        values[3] += output_tokens
        values[4] += reasoning_tokens
        values[5] += cost_usd
        self._dirty.add(row)
        self._changed[(self.origin, row)] = None

    def take_dirty(self) -> list[list[Any]]:
        """This origin's rows changed since the last call, in wire form (to send to every peer)."""
        own = self.origins[self.origin]
        out = [row_to_wire(row, own[row]) for row in self._dirty if row in own]
        self._dirty.clear()
        return out

    def take_changed(self) -> dict[str, list[list[Any]]]:
        """Every origin's rows changed since the last call, by origin (to journal)."""
        out: dict[str, list[list[Any]]] = {}
        for origin, row in self._changed:
            values = self.origins.get(origin, {}).get(row)
            if values is not None:
                out.setdefault(origin, []).append(row_to_wire(row, values))
        self._changed.clear()
        return out

    def merge(self, origin: str, rows: Iterable[Any], today: str | None = None) -> int:
        """A copy of ``origin``'s rows (a peer's, or the journal's): each field the larger; the rows taken. Rows
        past the retention (older than ``today`` by more than it) are ignored; a malformed row raises BadRows."""
        oldest = _days_before(today, self.config.retention_days) if today is not None else ""
        table = self.origins.get(origin)
        taken = 0
        for item in rows:
            row, values = row_from_wire(item)
            if row[0] < oldest:
                continue
            if table is None:
                table = self.origins[origin] = {}
            known = table.get(row)
            if known is None:
                table[row] = values
                self.rows += 1
                if values[COST]:
                    self._count_spent(row, values[COST])
            elif any(v > k for v, k in zip(values, known)):
                if values[COST] > known[COST]:
                    self._count_spent(row, values[COST] - known[COST])
                table[row] = [max(v, k) for v, k in zip(values, known)]
            else:
                continue
            taken += 1
            self._changed[(origin, row)] = None
        if self.rows > self.config.rows_max:
            self._drop_oldest_day()
        return taken

    def wire(self) -> dict[str, list[list[Any]]]:
        """Every origin's rows, by origin (a peer's full pull; a snapshot)."""
        return {origin: [row_to_wire(row, values) for row, values in table.items()]
                for origin, table in self.origins.items() if table}

    def forget_before(self, today: str) -> int:
        """Drop rows past the retention; how many."""
        return self._drop(lambda day: day < _days_before(today, self.config.retention_days))

    def _drop_oldest_day(self) -> None:
        while self.rows > self.config.rows_max:
            days = {row[0] for table in self.origins.values() for row in table}
            oldest = min(days)
            self.rows_dropped += self._drop(lambda day: day == oldest)

    def _count_spent(self, row: Row, cost_usd: float) -> None:
        day, key, tenant = row[0], row[1], row[2]
        spent = self._spent
        if key.startswith("key:"):
            index = ("key", key[4:], day)
            spent[index] = spent.get(index, 0.0) + cost_usd
        if tenant:
            index = ("tenant", tenant, day)
            spent[index] = spent.get(index, 0.0) + cost_usd

    def spent(self, scope: str, name: str, days: "Iterable[str]") -> float:
        """Dollars the ledger holds for a key's id or a tenant over these days, every node's requests."""
        return sum(self._spent.get((scope, name, day), 0.0) for day in days)

    def _drop(self, old: Any) -> int:
        dropped = 0
        for index in [i for i in self._spent if old(i[2])]:
            del self._spent[index]
        for table in self.origins.values():
            for row in [r for r in table if old(r[0])]:
                del table[row]
                self._dirty.discard(row)
                dropped += 1
        self.rows -= dropped
        return dropped

    def rows_of_every_origin(self) -> Iterator[tuple[Row, list[float]]]:
        """Every origin's rows (a row counted by two nodes comes twice: their sum is the cluster's)."""
        for table in self.origins.values():
            yield from table.items()


def _days_before(today: str, days: int) -> str:
    year, month, day = (int(part) for part in today.split("-"))  # not strptime: its first call compiles regexes
    return day_of(calendar.timegm((year, month, day, 0, 0, 0)) - days * DAY_S)


GROUPS = ("day", "month", "key", "tenant", "model", "target")


class ReportError(ValueError):
    """A report query that cannot be answered (the message names the parameter)."""


def report(ledger: SpendLedger, group_by: "tuple[str, ...]" = ("key",), since: str | None = None,
           until: str | None = None, filters: "dict[str, str] | None" = None) -> list[dict[str, Any]]:
    """The spend between two days (inclusive, UTC), summed by the fields of ``group_by`` (``GROUPS``: a month is
    YYYY-MM), keeping rows whose fields equal ``filters``; the dearest first."""
    unknown = [g for g in group_by if g not in GROUPS]
    if unknown:
        raise ReportError(f"group_by: {', '.join(unknown)} is not one of {', '.join(GROUPS)}")
    filters = filters or {}
    bad = [f for f in filters if f not in ROW_FIELDS[1:]]
    if bad:
        raise ReportError(f"filters: {', '.join(bad)} is not one of {', '.join(ROW_FIELDS[1:])}")
    index = {name: i for i, name in enumerate(ROW_FIELDS)}
    sums: dict[tuple[str, ...], list[float]] = {}
    for row, values in ledger.rows_of_every_origin():  # summed once, into the groups
        day = row[0]
        if (since is not None and day < since) or (until is not None and day > until):
            continue
        if any(row[index[f]] != v for f, v in filters.items()):
            continue
        group = tuple(day[:7] if g == "month" else row[index[g]] for g in group_by)
        known = sums.get(group)
        if known is None:
            sums[group] = list(values)
        else:
            for i, v in enumerate(values):
                known[i] += v
    out = []
    for group, values in sums.items():
        entry: dict[str, Any] = dict(zip(group_by, group))
        for name, v in zip(VALUE_FIELDS, values):
            entry[name] = round(v, 10) if name == "cost_usd" else int(v)
        out.append(entry)
    out.sort(key=lambda e: (-e["cost_usd"], -e["requests"], tuple(str(e[g]) for g in group_by)))
    return out


def report_csv(entries: list[dict[str, Any]], group_by: "tuple[str, ...]") -> str:
    import csv
    import io

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([*group_by, *VALUE_FIELDS])
    for entry in entries:
        writer.writerow([*(entry[g] for g in group_by), *(entry[v] for v in VALUE_FIELDS)])
    return buffer.getvalue()
