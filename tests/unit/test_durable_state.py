"""What a node keeps in its data directory (issue 62), owner by owner: the settings document, the memory backend's
shards, the gossip keyring, and the directory itself."""

from __future__ import annotations

import dataclasses
import os
import stat

import pytest

from gateway.cluster.doc_journal import DocJournal
from gateway.cluster.settings_doc import SettingsDocument
from gateway.history.journal import HistoryJournal
from gateway.history.shards import CONVERSATION, RESPONSE, MemoryShards
from gateway.history.store import HistoryConfig
from gateway.node.data_dir import DataDir, DataDirError, data_dir_of
from gateway.node.config import GatewayConfig
from mesh.crypto import Keyring, generate_key
from mesh.keyring_file import FILE_NAME, keyring_kept_in, read_keys
from mesh.worker_doc import WorkerDoc

NOW_S = 1_800_000_000.0


# -- the settings document ----------------------------------------------------------------------------------------------


def test_settings_and_workers_come_back_with_their_stamps(tmp_path):
    first = SettingsDocument("n1")
    first.keep_on_disk(tmp_path)
    first.set_setting("api_key:ab", {"id": "ab", "revoked": False})
    first.doc.register("w-1", {"url": "grpc://10.0.0.1:30001"})
    first.journal.record()
    stamp = first.doc.get("settings", "api_key:ab")["t"]

    again = SettingsDocument("n1")
    recovered = again.keep_on_disk(tmp_path)
    assert not recovered.damaged and again.keys_may_be_lost is None
    assert again.doc.setting("api_key:ab") == {"id": "ab", "revoked": False}
    assert again.doc.get("settings", "api_key:ab")["t"] == stamp  # not written again: a peer's newer value wins
    assert list(again.doc.workers()) == ["w-1"]


def test_a_revocation_made_elsewhere_while_a_node_was_down_stays_revoked(tmp_path):
    node = SettingsDocument("n1")
    node.keep_on_disk(tmp_path)
    node.set_setting("api_key:ab", {"revoked": False})
    peer = WorkerDoc("n2")
    peer.merge(node.doc.state())
    revocation = peer.set_setting("api_key:ab", {"revoked": True})  # while n1 is down

    restarted = SettingsDocument("n1")
    restarted.keep_on_disk(tmp_path)
    restarted.doc.merge(revocation)
    assert restarted.doc.setting("api_key:ab") == {"revoked": True}


def test_the_settings_log_is_compacted_to_the_document(tmp_path, monkeypatch):
    monkeypatch.setattr("gateway.cluster.doc_journal.COMPACT_BYTES_MIN", 4096)
    node = SettingsDocument("n1")
    node.keep_on_disk(tmp_path)
    for i in range(200):
        node.set_setting("rate_limits", {"round": i})
    assert node.journal.compactions >= 1
    again = SettingsDocument("n1")
    again.keep_on_disk(tmp_path)
    assert again.doc.setting("rate_limits") == {"round": 199}


def test_a_torn_settings_log_marks_the_keys_as_possibly_lost_until_accepted(tmp_path):
    node = SettingsDocument("n1")
    node.keep_on_disk(tmp_path)
    node.set_setting("api_key:ab", {"revoked": False})
    log = next(tmp_path.glob("cluster-doc.log.*"))
    log.write_bytes(log.read_bytes()[:-5])

    again = SettingsDocument("n1")
    again.keep_on_disk(tmp_path)
    assert again.keys_may_be_lost is not None and "smg-node data accept" in again.keys_may_be_lost
    third = SettingsDocument("n1")  # the next start still knows: the torn tail is kept aside
    third.keep_on_disk(tmp_path)
    assert third.keys_may_be_lost is not None
    accepted = third.accept_loss()
    assert accepted and all(p.name.endswith(".accepted") for p in accepted)
    assert third.keys_may_be_lost is None
    fourth = SettingsDocument("n1")
    fourth.keep_on_disk(tmp_path)
    assert fourth.keys_may_be_lost is None


def test_records_a_document_refuses_are_counted_not_fatal(tmp_path):
    node = SettingsDocument("n1")
    node.keep_on_disk(tmp_path)
    node.journal.journal.append(b"not an update")
    again = DocJournal(tmp_path, WorkerDoc("n1"))
    recovered = again.restore()
    assert any("refused" in p for p in recovered.problems)


# -- the memory backend's shards -----------------------------------------------------------------------------------------


def _shards(tmp_path, now_s: float = NOW_S) -> tuple[MemoryShards, HistoryJournal]:
    shards = MemoryShards(HistoryConfig())
    journal = HistoryJournal(tmp_path, shards)
    journal.restore(now_s)
    return shards, journal


def _held(shards: MemoryShards) -> dict:
    return {i: (s.kind, s.owner, s.version, s.head, dict(s.items)) for i in shards.ids() for s in [shards.peek(i)]}


def test_every_kind_of_change_comes_back(tmp_path):
    shards, _ = _shards(tmp_path)
    shards.create("resp_1", RESPONSE, "t", b'{"id":"resp_1"}', [], NOW_S)
    conversation = shards.create("conv_1", CONVERSATION, "t", b'{"id":"conv_1"}', [("i1", b'"one"')], NOW_S)
    shards.update(conversation, NOW_S + 1, added=[("i2", b'"two"')])
    shards.update(conversation, NOW_S + 2, removed=["i1"], head=b'{"id":"conv_1","metadata":{}}')
    gone = shards.create("resp_2", RESPONSE, "t", b"{}", [], NOW_S)
    shards.delete(gone, NOW_S + 3)
    shards.create("resp_3", RESPONSE, "u", b"{}", [], NOW_S)
    shards.forget("resp_3")  # a copy trimmed: no tombstone
    # A replica's changes: whole, then a delta on it.
    replica = MemoryShards(HistoryConfig())
    made = replica.create("conv_9", CONVERSATION, "v", b"{}", [], NOW_S)
    shards.apply(made.whole(), NOW_S)
    shards.apply(replica.update(made, NOW_S + 1, added=[("x", b'"x"')]), NOW_S + 1)

    again, _ = _shards(tmp_path, NOW_S + 10)
    assert _held(again) == _held(shards)
    assert again.deleted("resp_2") and not again.deleted("resp_3")


def test_what_expired_while_the_node_was_down_does_not_come_back(tmp_path):
    shards, _ = _shards(tmp_path)
    shards.create("resp_1", RESPONSE, "t", b"{}", [], NOW_S)
    again, _ = _shards(tmp_path, NOW_S + HistoryConfig().retention_s + 1)
    assert again.ids() == []


async def test_a_compaction_snapshots_the_shards_and_appends_go_on(tmp_path):
    shards, journal = _shards(tmp_path)
    for i in range(20):
        shards.create(f"resp_{i}", RESPONSE, "t", b'{"n":%d}' % i, [], NOW_S)
    gone = shards.create("resp_gone", RESPONSE, "t", b"{}", [], NOW_S)
    shards.delete(gone, NOW_S + 1)
    await journal.compact()
    shards.create("resp_after", RESPONSE, "t", b"{}", [], NOW_S + 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["history.log.1", "history.snap.1"]
    again, _ = _shards(tmp_path, NOW_S + 3)
    assert _held(again) == _held(shards) and again.deleted("resp_gone")


# -- the keyring ---------------------------------------------------------------------------------------------------------


def test_the_keyring_kept_wins_over_the_configured_key_after_a_rotation(tmp_path, caplog):
    old, new = generate_key(), generate_key()
    keyring = keyring_kept_in(tmp_path, [old])
    keyring.install(new)
    keyring.use(new)
    keyring.remove(old)
    assert read_keys(tmp_path) == [new]
    assert stat.S_IMODE(os.stat(tmp_path / FILE_NAME).st_mode) == 0o600

    restarted = keyring_kept_in(tmp_path, [old])  # the unit file still says --encrypt OLD
    assert restarted.texts() == [new]
    assert "is not in it" in caplog.text


def test_an_unreadable_keyring_is_set_aside_and_the_configured_key_used(tmp_path):
    key = generate_key()
    (tmp_path / FILE_NAME).write_bytes(b'{"version": 9, "keys": []}')
    keyring = keyring_kept_in(tmp_path, [key])
    assert keyring.texts() == [key]
    assert (tmp_path / (FILE_NAME + ".unreadable")).exists()
    assert read_keys(tmp_path) == [key]


def test_a_mesh_in_the_clear_keeps_no_keyring(tmp_path):
    assert not keyring_kept_in(tmp_path, []).enabled
    assert not (tmp_path / FILE_NAME).exists()


def test_the_keyring_tells_its_listeners_only_of_real_changes():
    key = generate_key()
    keyring = Keyring([key])
    seen = []
    keyring.listeners.append(lambda k: seen.append(k.texts()))
    keyring.install(key)  # already there
    keyring.use(key)  # already primary
    keyring.remove(generate_key())  # not there
    assert seen == []


# -- the directory ----------------------------------------------------------------------------------------------------------


def test_a_directory_is_one_process_s(tmp_path):
    first = DataDir(tmp_path / "d")
    with pytest.raises(DataDirError, match="in use by another smg-node process"):
        DataDir(tmp_path / "d")
    first.close()
    DataDir(tmp_path / "d").close()
    assert stat.S_IMODE(os.stat(tmp_path / "d").st_mode) == 0o700


def test_where_a_node_keeps_its_state(tmp_path, monkeypatch):
    monkeypatch.setenv("SMG_NODE_DATA_ROOT", str(tmp_path))
    base = GatewayConfig()
    assert data_dir_of(base) == tmp_path / "port-30000"
    assert data_dir_of(dataclasses.replace(base, data_dir="none")) is None
    assert data_dir_of(dataclasses.replace(base, port=0)) is None
    explicit = dataclasses.replace(base, data_dir=str(tmp_path / "x"), worker_index=2)
    assert data_dir_of(explicit) == tmp_path / "x" / "process-2"


def test_the_ready_line_says_keys_were_kept_and_that_inference_is_refused():
    import types

    from gateway.node.server import ready_note
    settings = SettingsDocument("n1")
    state = types.SimpleNamespace(registry=types.SimpleNamespace(all=lambda: [1]),
                                  status=types.SimpleNamespace(unreachable_engines=set()), settings=settings)
    assert ready_note(state, None) == "1 worker"
    settings.keys_read_back = 2
    settings.keys_may_be_lost = "why"
    assert ready_note(state, None) == ("1 worker, 2 API keys kept from an earlier start, inference refused: kept keys "
                                       "unreadable (smg-node data status)")


def test_the_settings_document_counts_the_keys_it_read_back(tmp_path):
    from gateway.auth.key_store import SETTING_PREFIX
    from gateway.cluster.settings_doc import API_KEY_SETTING_PREFIX
    assert API_KEY_SETTING_PREFIX == SETTING_PREFIX
    node = SettingsDocument("n1")
    node.keep_on_disk(tmp_path)
    node.set_setting("api_key:ab", {})
    node.set_setting("rate_limits", {})
    again = SettingsDocument("n1")
    again.keep_on_disk(tmp_path)
    assert again.keys_read_back == 1
