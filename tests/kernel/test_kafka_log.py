"""librdkafka's log lines reach Python logging once per distinct message per window (not 580 raw lines)."""

from __future__ import annotations

import logging

from sie.kernel.kafka_log import RepeatFilter, kafka_logger


def _record(text: str, level: int = logging.ERROR) -> logging.LogRecord:
    # confluent-kafka calls logger.log(level, "%s [%s] %s", facility, client name, message)
    return logging.LogRecord("sie.kafka", level, __file__, 1, "%s [%s] %s", ("FAIL", "rdkafka#producer-1", text), None)


def test_a_reconnect_loop_is_one_line_per_window_and_the_next_line_counts_the_rest():
    now = [0.0]
    f = RepeatFilter(window_s=60, clock=lambda: now[0])
    lines = [f"127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused (after {i}ms)"
             for i in range(200)]
    passed = [r for r in (_record(t) for t in lines) if f.filter(r)]
    assert len(passed) == 1 and f.suppressed == 199
    assert f.filter(_record("another problem"))  # a different message passes at once
    now[0] = 61.0
    again = _record(lines[0])
    assert f.filter(again) and "(%d similar line(s) held back)" in again.msg
    assert again.getMessage().endswith("(199 similar line(s) held back)")


def test_every_client_config_routes_logs_to_sie_kafka():
    from sie.kernel.settings import Settings

    logger = Settings().kafka_client_config()["logger"]
    assert logger is kafka_logger() and logger.name == "sie.kafka"
    assert sum(isinstance(x, RepeatFilter) for x in logger.filters) == 1  # installed once
