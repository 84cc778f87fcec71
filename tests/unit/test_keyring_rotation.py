"""The keyring rotation's messages between members (mesh/keyring_rotation.py): what a member asks and answers, and
what it refuses (bounded, one of three ops, a key)."""

from __future__ import annotations

import pytest

from mesh.keyring_rotation import (KEYRING_STREAM_MARK, KeyringRequestError, RotationReport, decode_answer,
                                   decode_request, encode_answer, encode_request)


def test_a_request_and_its_answers_round_trip():
    assert decode_request(encode_request("use", "a2V5")) == ("use", "a2V5")
    assert decode_answer(encode_answer(["f1", "f2"])) == (["f1", "f2"], None)
    assert decode_answer(encode_answer(None, "install a key before making it primary")) == \
        (None, "install a key before making it primary")


@pytest.mark.parametrize("data", [KEYRING_STREAM_MARK + b"not json", KEYRING_STREAM_MARK + b'{"op": "drop"}',
                                  KEYRING_STREAM_MARK + b'{"op": "use", "key": 7}',
                                  KEYRING_STREAM_MARK + b'{"op": "use", "key": "' + b"k" * 600 + b'"}'])
def test_what_is_not_a_rotation_request_is_refused(data):
    with pytest.raises(KeyringRequestError):
        decode_request(data)


def test_an_unreadable_answer_is_a_reason_not_a_crash():
    assert decode_answer(b"U{}")[1] == "no keyring answer"
    assert decode_answer(KEYRING_STREAM_MARK + b"{")[1] == "an answer that is not JSON"


def test_a_report_is_complete_only_after_the_three_phases():
    report = RotationReport("new", "old", ["install", "use"], {"n1": "ok", "n2": "not reached: timeout"})
    assert not report.completed and report.to_json()["phases_done"] == ["install", "use"]
    report.phases_done.append("remove")
    assert report.completed
