"""The document that holds a node's settings changed at run time (API keys, rate limits), kept on disk when the node
has a data directory.

In a cluster it is the cluster's document (``ClusterState``, which adds the workers, replication and ownership); a
lone node has one of its own, ``SettingsDocument`` itself, so that the keys an operator creates at run time
survive its restart as a cluster's do (a lone node forgetting its keys would reopen inference to anyone). Either
way a subsystem writes with ``set_setting`` and reads with ``follow_settings``, and never asks which it has.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from mesh.worker_doc import WorkerDoc

from ..observe.metrics import gauge
from .doc_journal import DocJournal

log = logging.getLogger("gateway.cluster")

# The settings that are API keys' records (gateway/auth/key_store.py SETTING_PREFIX; the cluster package does not
# import auth): counted for the READY line.
API_KEY_SETTING_PREFIX = "api_key:"


class SettingsDocument:
    def __init__(self, node_name: str) -> None:
        self.node_name = node_name
        self.doc = WorkerDoc(node_name)
        self.on_setting: list[Any] = []  # callables (name, value) for settings changed by peers
        self.bad_settings = 0  # settings a subsystem failed on (each subsystem also refuses bad values itself)
        self.journal: DocJournal | None = None  # the document on disk (keep_on_disk), None: kept nowhere
        # Why the keys this node held may be lost (its document on disk could not all be read back, now or at an
        # earlier start nobody accepted): the node then refuses inference while it knows no key. None: nothing lost.
        self.keys_may_be_lost: str | None = None
        self.keys_read_back = 0  # run-time API keys the node read back from its data directory at start

    def keep_on_disk(self, directory: Any, fsync_each: bool = False) -> Any:
        """Read the document back from ``directory`` (before the node serves, and joins a cluster) and from now on
        write every change there before it is acknowledged (doc_journal.py). Returns what was read
        (mesh.journal.Recovered: its problems say what could not be)."""
        self.journal = DocJournal(directory, self.doc, fsync_each)
        recovered = self.journal.restore()
        for problem in recovered.problems:
            log.warning("keys and settings on disk: %s", problem)
        left = self.journal.set_aside()
        if recovered.problems or left:
            why = recovered.problems[0] if recovered.problems else f"{left[0]} was set aside at an earlier start"
            self.keys_may_be_lost = (
                f"this node could not read back all of the API keys and settings it kept ({why}); while it knows "
                "no key it refuses inference rather than serve it to anyone: it takes the keys from a peer when it "
                "joins one, or an operator runs `smg-node data accept` once the loss is understood")
        self.keys_read_back = sum(1 for name in self.doc.settings() if name.startswith(API_KEY_SETTING_PREFIX))
        log.info("keys and settings: %d settings (%d API keys) and %d workers read back from %s",
                 len(self.doc.settings()), self.keys_read_back, len(self.doc.workers()), directory)
        return recovered

    def metric_families(self) -> "Iterator[Any]":
        """What the data directory says of this node (deploy/prometheus/ alerts on the first)."""
        yield gauge("smg_data_keys_may_be_lost", "1 while this node refuses inference because the keys it kept could "
                    "not all be read back (smg-node data status)", [], [([], 1.0 if self.keys_may_be_lost else 0.0)])
        journal = self.journal
        if journal is not None:
            yield gauge("smg_data_log_bytes", "Bytes of the settings document's journal log since its last snapshot",
                        ["journal"], [(["cluster-doc"], float(journal.journal.log_bytes))])

    def accept_loss(self) -> "list[Any]":
        """The operator accepts what could not be read back: inference opens again where no key is known."""
        self.keys_may_be_lost = None
        return self.journal.accept_loss() if self.journal is not None else []

    @property
    def data_dir(self) -> Any:
        """The directory the document is kept in; None when it is kept nowhere."""
        return self.journal.journal.directory if self.journal is not None else None

    def _persist(self) -> None:
        if self.journal is not None:
            self.journal.record()

    def set_setting(self, name: str, value: Any) -> None:
        self.doc.set_setting(name, value)
        self._persist()

    def follow_settings(self, callback: Any) -> None:
        """Call ``callback(name, value)`` for every setting the document holds now, and for each one a
        peer changes from now on: a subsystem sees the cluster's value whether it came first or later."""
        self.on_setting.append(callback)
        for name, entry in self.doc.settings().items():
            callback(name, entry.get("value"))

    def _tell(self, names: "set[str]") -> None:
        """The followers, of settings a peer changed."""
        for name in sorted(names):
            entry = self.doc.get("settings", name)
            for callback in self.on_setting:
                try:
                    callback(name, entry.get("value") if entry is not None else None)
                except Exception:  # one subsystem's trouble with a peer's value must not stop the others
                    self.bad_settings += 1
                    log.exception("a subsystem failed on the cluster setting %r", name)
