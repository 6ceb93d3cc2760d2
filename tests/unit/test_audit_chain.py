"""The audit hash chain, as pure logic: sealing, verification and tamper detection."""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from registry.store.audit_chain import GENESIS_HASH, event_content, event_hash, format_ts, parse_ts, seal, verify_chain

T0 = datetime(2026, 11, 22, 2, 3, 4, 123456, tzinfo=timezone.utc)


def make_chain(n: int, details: list[dict] | None = None) -> list[dict]:
    events, prev = [], GENESIS_HASH
    for i in range(n):
        event = seal({"seq": i + 1, "ts": format_ts(T0 + timedelta(seconds=i)),
                      "actor": f"user{i % 3}", "host": "h", "action": "alias.move",
                      "model": "bert", "version": i + 1, "digest": "sha256:" + f"{i:064x}",
                      "ref": "bert@prod", "details": (details or [{}] * n)[i]}, prev_hash=prev)
        events.append(event)
        prev = event["hash"]
    return events


def test_timestamps_have_one_canonical_text_that_round_trips():
    text = format_ts(T0)
    assert text == "2026-11-22T02:03:04.123456Z"
    assert parse_ts(text) == T0
    assert format_ts(datetime(2026, 1, 2, 3, 4, 5)) == "2026-01-02T03:04:05.000000Z"  # naive: UTC
    plus_two = timezone(timedelta(hours=2))
    assert format_ts(T0.astimezone(plus_two)) == text


def test_content_is_the_same_from_records_and_from_stored_rows():
    stored = {"seq": 1, "ts": format_ts(T0), "action": "pull", "details": '{"a":1}'}
    record = {"seq": 1, "ts": T0, "action": "pull", "details": {"a": 1}}
    assert event_content(stored) == event_content(record)
    assert event_content({"seq": 1})["details"] == {}


def test_hash_covers_every_field_and_the_previous_hash():
    event = make_chain(1)[0]
    content = event_content(event)
    base = event_hash(content, GENESIS_HASH)
    assert base == event["hash"]
    assert event_hash(content, "1" * 64) != base
    for name in ("seq", "ts", "actor", "host", "action", "model", "version", "digest", "ref"):
        changed = {**content, name: "x"}
        assert event_hash(changed, GENESIS_HASH) != base, name
    assert event_hash({**content, "details": {"k": 1}}, GENESIS_HASH) != base


def test_intact_chain_and_empty_log_verify():
    assert verify_chain([]).ok
    verdict = verify_chain(make_chain(5))
    assert verdict.ok and verdict.first_bad_seq is None
    assert "5 events" in verdict.reason


def test_verify_accepts_records_with_attributes():
    class Record:
        def __init__(self, d):
            self.__dict__.update(d, ts=parse_ts(d["ts"]))

    assert verify_chain([Record(e) for e in make_chain(3)]).ok


def test_edited_field_names_that_event():
    events = make_chain(5)
    events[2] = {**events[2], "actor": "mallory"}
    verdict = verify_chain(events)
    assert (verdict.ok, verdict.first_bad_seq) == (False, 3)
    assert "altered" in verdict.reason


def test_edited_details_text_is_detected_even_if_not_json():
    events = make_chain(3, details=[{"alias": "prod"}] * 3)
    events[1] = {**events[1], "details": '{"alias": "prod", "from": 9}'}
    assert verify_chain(events).first_bad_seq == 2
    events[1] = {**events[1], "details": "{not json"}
    verdict = verify_chain(events)
    assert verdict.first_bad_seq == 2 and "cannot be read" in verdict.reason


def test_deleted_middle_event_names_the_next_event():
    events = make_chain(5)
    del events[2]
    verdict = verify_chain(events)
    assert (verdict.ok, verdict.first_bad_seq) == (False, 4)
    assert "missing" in verdict.reason


def test_deleted_first_event_is_detected():
    verdict = verify_chain(make_chain(3)[1:])
    assert (verdict.ok, verdict.first_bad_seq) == (False, 2)


def test_reordered_events_are_detected():
    events = make_chain(4)
    events[1], events[2] = events[2], events[1]
    assert verify_chain(events).first_bad_seq == 3  # stored order: 1, 3, 2, 4


def test_swapped_sequence_numbers_are_detected():
    events = make_chain(4)
    a, b = events[1], events[2]
    events[1], events[2] = {**b, "seq": 2}, {**a, "seq": 3}
    assert verify_chain(events).first_bad_seq == 2


def test_rehashing_an_edit_breaks_the_link_to_the_next_event():
    events = make_chain(4)
    forged = seal({**events[1], "actor": "mallory"}, prev_hash=events[1]["prev_hash"])
    events[1] = forged
    verdict = verify_chain(events)
    assert verdict.first_bad_seq == 3 and "does not link" in verdict.reason


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 12), data=st.data())
def test_any_single_tampering_is_found_at_the_right_event(n, data):
    events = make_chain(n, details=[{"i": i} for i in range(n)])
    index = data.draw(st.integers(0, n - 1))
    how = data.draw(st.sampled_from(["edit", "delete", "details"]))
    if how == "edit":
        field = data.draw(st.sampled_from(["actor", "host", "action", "model", "ref", "ts"]))
        events[index] = {**events[index], field: events[index][field] + "x"}
        expected = index + 1
    elif how == "details":
        events[index] = {**events[index], "details": json.dumps({"i": -1})}
        expected = index + 1
    else:
        if index == n - 1:
            index = data.draw(st.integers(0, n - 2))
        del events[index]
        expected = index + 2
    verdict = verify_chain(events)
    assert not verdict.ok
    assert verdict.first_bad_seq == expected


def test_truncating_the_tail_is_not_detectable_by_the_chain_alone():
    # Documented limit: a hash chain proves the prefix it has; dropping the newest events
    # leaves a valid shorter chain. (Anchoring the head elsewhere would be needed.)
    assert verify_chain(make_chain(5)[:3]).ok


@pytest.mark.parametrize("seq", [None, "1"])
def test_odd_sequence_values_do_not_crash(seq):
    events = make_chain(2)
    events[0] = {**events[0], "seq": seq}
    assert not verify_chain(events).ok


def test_version_fields_hash_covers_each_field_and_ignores_edge_order():
    from registry.store.audit_chain import version_fields_hash

    edges = [("dataset", "s3://d", "sha256:" + "a" * 64, None), ("run", "r1", None, None),
             ("commit", "c" * 40, None, '{"dirty":true}')]
    base = version_fields_hash("ana@h", '{"k":"v"}', edges)
    assert version_fields_hash("ana@h", '{"k":"v"}', list(reversed(edges))) == base
    changed = [
        version_fields_hash("eve@h", '{"k":"v"}', edges),
        version_fields_hash("ana@h", '{"k":"w"}', edges),
        version_fields_hash("ana@h", '{"k":"v"}', edges[:2]),
        version_fields_hash("ana@h", '{"k":"v"}', edges + [("run", "r2", None, None)]),
        version_fields_hash("ana@h", '{"k":"v"}', [edges[0], ("run", "r1 ", None, None), edges[2]]),
        version_fields_hash("ana@h", '{"k":"v"}', [*edges[:2], ("commit", "c" * 40, None, None)]),
    ]
    assert base not in changed and len(set(changed)) == len(changed)
