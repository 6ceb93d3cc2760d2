"""One time format (``registry.format.times.iso_utc``): what ``--json``, the server's JSON, the CLI's
tables, the web pages and the audit chain write, and every reader of times reads back."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st

from registry.format.times import iso_utc
from registry.remote.wire import format_datetime, parse_datetime
from registry.store.audit_chain import format_ts, parse_ts

aware = st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(2200, 1, 1),
                     timezones=st.sampled_from([timezone.utc, timezone(timedelta(hours=5, minutes=30)),
                                                timezone(timedelta(hours=-8))]))


def test_utc_with_z_fixed_width_and_naive_taken_as_utc():
    t = datetime(2026, 11, 22, 2, 3, 4, tzinfo=timezone(timedelta(hours=-3)))
    assert iso_utc(t) == "2026-11-22T05:03:04.000000Z"  # microseconds always written
    assert iso_utc(t, seconds=True) == "2026-11-22T05:03:04Z"
    assert iso_utc(datetime(2026, 11, 22, 5, 3, 4, 999999), seconds=True) == "2026-11-22T05:03:04Z"  # truncated
    assert iso_utc(datetime(2026, 11, 22, 5, 3, 4)) == iso_utc(t)  # naive: UTC
    assert iso_utc(None) is None


@given(aware)
def test_every_writer_agrees_and_every_reader_reads_it_back(t):
    text = iso_utc(t)
    assert text == format_ts(t) == format_datetime(t)  # the audit chain and the server's JSON
    assert parse_ts(text) == t and parse_datetime(text) == t
    assert datetime.fromisoformat(text) == t  # Python's own reader (3.11+ takes the Z)
    assert iso_utc(t, seconds=True) == text[:19] + "Z"


@given(aware, aware)
def test_text_order_is_time_order(a, b):
    assert (iso_utc(a) < iso_utc(b)) == (a < b)
