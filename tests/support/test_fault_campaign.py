"""The fault campaign's own rules (tests/support/fault_campaign.py), without a broker: where it looks for the
transaction coordinator, and how it accounts outputs per request record."""

from __future__ import annotations

from tests.support.fault_campaign import account, coordinator_partition, java_string_hash


def test_coordinator_partitions_follow_javas_string_hash() -> None:
    """The campaign finds the transaction coordinator by Kafka's own placement rule (no describe_transactions
    in confluent-kafka); the same rule, checked here against Java's values, is cross-checked on the broker
    for the group coordinator (``group_coordinator``)."""
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -(1 << 31)  # Integer.MIN_VALUE: Utils.abs gives 0
    assert coordinator_partition("polygenelubricants", 10) == 0
    assert java_string_hash("Aa") == java_string_hash("BB") == 2112
    assert java_string_hash("é") == 233  # a UTF-16 code unit, not the UTF-8 bytes


def test_the_account_is_per_request_record() -> None:
    """A request the load's producer wrote twice (librdkafka #4953: an epoch bump re-sends a possibly persisted
    batch) is two records, each owed one output; a third output, or a second for a request written once, is a
    duplicate of the stage; an id missing from the request topic's read still owes one."""
    records = {"r-1": [(0, 5)], "r-2": [(1, 7), (1, 9)], "r-3": [(2, 3)]}
    ids = ["r-1", "r-2", "r-3", "r-4"]
    assert account(ids, {"r-1": 1, "r-2": 2, "r-3": 1, "r-4": 1}, records) == ([], {})
    assert account(ids, {"r-1": 2, "r-2": 3, "r-3": 1, "r-4": 1}, records) == ([], {"r-1": 1, "r-2": 1})
    assert account(ids, {"r-1": 1, "r-2": 1, "r-4": 2}, records) == (["r-2", "r-3"], {"r-4": 1})
