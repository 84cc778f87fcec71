"""Frames that fail authentication, by the host they came from: said in the log per host, and once a host has
sent too many, what it sends from addresses that never opened is dropped unread. No I/O: the time is passed in,
the caller logs what it is given.

Why: with the gossip key derived from a weak admin token, a local process guessed six words in a row, one
sealed packet per guess, and each guess was only a ``decrypt`` drop among the counters. Now every host whose
packets or stream hellos do not open is named in the log (at most once a window per host, with how many), and a
host that sent ``mute_after`` of them in one window is muted for the next: guessing is ``mute_after`` tries a
window, logged.

Rules:

- a frame that opens records its address (host:port) and its host as good for ``window_s``;
- failures count per host in windows of ``window_s`` from the first one; at ``mute_after`` in one window the host
  is muted until ``window_s`` after that;
- while a host is muted, a packet from it is dropped unopened unless its exact address opened in the last window
  (a member's packets come from its bind port: members sharing the attacker's host, as on one machine, and a
  member whose address an attacker spoofs, keep theirs opening); a stream hello (from an ephemeral port) is
  refused unless some address of the host opened in the last window;
- one log line per host per window: the first failure's, then the mute's;
- at most ``hosts_max`` hosts and ``addresses_max`` good addresses per host are held (a flood of spoofed sources
  forgets the oldest, never grows).
"""

from __future__ import annotations

import collections
import dataclasses


@dataclasses.dataclass
class _Host:
    window_start: float = float("-inf")
    failures: int = 0
    muted_until: float = float("-inf")
    said_at: float = float("-inf")
    last_success: float = float("-inf")
    good: "collections.OrderedDict[str, float]" = dataclasses.field(default_factory=collections.OrderedDict)


class AuthFailures:
    def __init__(self, window_s: float = 60.0, mute_after: int = 64, hosts_max: int = 1024,
                 addresses_max: int = 64) -> None:
        self.window_s = window_s
        self.mute_after = mute_after
        self.hosts_max = hosts_max
        self.addresses_max = addresses_max
        self._hosts: collections.OrderedDict[str, _Host] = collections.OrderedDict()

    def _host(self, host: str) -> _Host:
        held = self._hosts.get(host)
        if held is None:
            held = self._hosts[host] = _Host()
            if len(self._hosts) > self.hosts_max:
                self._hosts.popitem(last=False)
        else:
            self._hosts.move_to_end(host)
        return held

    def succeeded(self, host: str, address: str, now: float) -> None:
        """A frame from ``address`` (on ``host``; "" for a stream's ephemeral port) opened."""
        held = self._host(host)
        held.last_success = now
        if address:
            good = held.good
            good[address] = now
            good.move_to_end(address)
            if len(good) > self.addresses_max:
                good.popitem(last=False)

    def muted(self, host: str, address: str, now: float) -> bool:
        """A frame from ``address`` on ``host`` (``address`` "": a stream hello) is to be dropped unopened."""
        held = self._hosts.get(host)
        if held is None or now >= held.muted_until:
            return False
        if address:
            return now - held.good.get(address, float("-inf")) >= self.window_s
        return now - held.last_success >= self.window_s

    def failed(self, host: str, now: float, what: str) -> str | None:
        """A frame (``what``: "packet", "hello") from ``host`` did not open; the log line to write, if any."""
        held = self._host(host)
        if now - held.window_start >= self.window_s:
            held.window_start, held.failures = now, 0
        held.failures += 1
        if held.failures >= self.mute_after and now >= held.muted_until:
            held.muted_until = now + self.window_s
            held.said_at = now
            return (f"{held.failures} packets or stream hellos from {host} failed authentication within "
                    f"{self.window_s:g} s: what it sends from addresses that never opened is ignored for "
                    f"{self.window_s:g} s (a node with another gossip key, or someone guessing it)")
        if now - held.said_at >= self.window_s:
            held.said_at = now
            return (f"a {what} from {host} failed authentication: a node with another gossip key (--encrypt, or "
                    "another admin token when the key is derived from it), or someone guessing it (said once a "
                    f"minute per host; after {self.mute_after} in {self.window_s:g} s its unknown addresses are "
                    "ignored)")
        return None
