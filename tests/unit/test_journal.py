"""The journal on disk (mesh/journal.py): records back in order, compaction, and every kind of damage read back
as its intact part with a line saying what was dropped."""

from __future__ import annotations

import os
import stat

from mesh.journal import FORMAT_VERSION, Journal


def _journal(tmp_path, **kwargs) -> Journal:
    return Journal(tmp_path / "data", "doc", content_version=1, **kwargs)


def _reopen(tmp_path, **kwargs):
    journal = _journal(tmp_path, **kwargs)
    return journal, journal.open()


def test_a_first_start_has_nothing_and_says_so(tmp_path):
    journal, recovered = _reopen(tmp_path)
    assert recovered.records == [] and not recovered.had_files and not recovered.damaged
    journal.close()
    _, again = _reopen(tmp_path)
    assert again.had_files and again.records == []


def test_records_come_back_in_order_after_the_process_goes_without_closing(tmp_path):
    journal, _ = _reopen(tmp_path)
    for i in range(100):
        journal.append(b"record %d" % i)
    # No close, no fsync: what write(2) handed the kernel is what a SIGKILLed process leaves.
    _, recovered = _reopen(tmp_path)
    assert recovered.records == [b"record %d" % i for i in range(100)]
    assert not recovered.damaged


def test_the_files_are_private(tmp_path):
    journal, _ = _reopen(tmp_path, fsync_each=True)
    journal.append(b"secret")
    journal.compact([b"secret"])
    assert stat.S_IMODE(os.stat(tmp_path / "data").st_mode) == 0o700
    for path in (tmp_path / "data").iterdir():
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path


def test_a_compaction_replaces_the_log_by_a_snapshot_and_appends_go_on(tmp_path):
    journal, _ = _reopen(tmp_path)
    for i in range(10):
        journal.append(b"old %d" % i)
    generation = journal.rotate()
    journal.append(b"during the snapshot")
    journal.write_snapshot(generation, [b"state"])
    journal.append(b"after")
    names = sorted(p.name for p in (tmp_path / "data").iterdir())
    assert names == ["doc.log.1", "doc.snap.1"]
    _, recovered = _reopen(tmp_path)
    assert recovered.records == [b"state", b"during the snapshot", b"after"]


def test_a_crash_before_the_snapshot_was_whole_replays_the_old_logs(tmp_path):
    journal, _ = _reopen(tmp_path)
    journal.append(b"a")
    generation = journal.rotate()
    journal.append(b"b")
    # The snapshot's temporary file is all there is of it: it never took the snapshot's name.
    (tmp_path / "data" / f"doc.snap.{generation}.tmp").write_bytes(b"SMGJ half")
    _, recovered = _reopen(tmp_path)
    assert recovered.records == [b"a", b"b"] and not recovered.damaged


def test_a_torn_tail_keeps_the_intact_prefix_and_says_what_was_dropped(tmp_path):
    journal, _ = _reopen(tmp_path)
    for i in range(5):
        journal.append(b"record %d" % i)
    log = tmp_path / "data" / "doc.log.0"
    whole = log.read_bytes()
    log.write_bytes(whole[:-3])  # the last record cut short
    journal, recovered = _reopen(tmp_path)
    assert recovered.records == [b"record %d" % i for i in range(4)]
    assert recovered.damaged and "after 4 records" in recovered.problems[0]
    assert (tmp_path / "data" / "doc.log.0.torn").exists()
    # New records follow the intact ones, not the garbage.
    journal.append(b"next")
    _, again = _reopen(tmp_path)
    assert again.records == [*(b"record %d" % i for i in range(4)), b"next"] and not again.damaged


def test_a_corrupt_record_ends_the_log_there(tmp_path):
    journal, _ = _reopen(tmp_path)
    for i in range(3):
        journal.append(b"record %d" % i)
    log = tmp_path / "data" / "doc.log.0"
    data = bytearray(log.read_bytes())
    data[-2] ^= 0xFF  # a flipped byte in the last record's payload
    log.write_bytes(bytes(data))
    _, recovered = _reopen(tmp_path)
    assert recovered.records == [b"record 0", b"record 1"]
    assert "checksum" in recovered.problems[0]


def test_a_length_past_the_bound_is_damage_not_a_record_to_allocate(tmp_path):
    journal, _ = _reopen(tmp_path)
    journal.append(b"fine")
    with open(tmp_path / "data" / "doc.log.0", "ab") as f:
        f.write(b"\xff\xff\xff\xff\x00\x00\x00\x00")
    _, recovered = _reopen(tmp_path)
    assert recovered.records == [b"fine"] and "record of 4294967295 bytes" in recovered.problems[0]


def test_a_log_cut_inside_its_header_starts_again(tmp_path):
    journal, _ = _reopen(tmp_path)
    journal.close()
    (tmp_path / "data" / "doc.log.0").write_bytes(b"SM")
    journal, recovered = _reopen(tmp_path)
    assert recovered.records == [] and recovered.damaged
    journal.append(b"x")
    assert _reopen(tmp_path)[1].records == [b"x"]


def test_a_damaged_snapshot_is_set_aside_and_named(tmp_path):
    journal, _ = _reopen(tmp_path)
    journal.compact([b"state"])
    snap = tmp_path / "data" / "doc.snap.1"
    snap.write_bytes(snap.read_bytes()[:-1])
    _, recovered = _reopen(tmp_path)
    assert recovered.records == [] and "snapshot 1 is damaged" in recovered.problems[0]
    assert (tmp_path / "data" / "doc.snap.1.unreadable").exists()


def test_an_unknown_version_is_kept_aside_untouched_and_said_in_one_line(tmp_path):
    journal, _ = _reopen(tmp_path)
    journal.append(b"from the future")
    journal.close()
    log = tmp_path / "data" / "doc.log.0"
    data = bytearray(log.read_bytes())
    data[4] = FORMAT_VERSION + 1
    log.write_bytes(bytes(data))
    journal, recovered = _reopen(tmp_path)
    assert recovered.records == [] and recovered.kept_aside is not None
    assert len(recovered.problems) == 1 and "journal format 2" in recovered.problems[0]
    assert (recovered.kept_aside / "doc.log.0").read_bytes() == bytes(data)
    journal.append(b"now")
    assert _reopen(tmp_path)[1].records == [b"now"]


def test_a_record_format_the_owner_does_not_read_is_kept_aside(tmp_path):
    old = Journal(tmp_path / "data", "doc", content_version=2)
    old.open()
    old.append(b"v2 record")
    old.close()
    _, recovered = _reopen(tmp_path)
    assert recovered.records == [] and "record format 2" in recovered.problems[0]


def test_another_journal_in_the_directory_is_not_read(tmp_path):
    other = Journal(tmp_path / "data", "history", content_version=1)
    other.open()
    other.append(b"not the doc's")
    _, recovered = _reopen(tmp_path)
    assert recovered.records == [] and not recovered.had_files
