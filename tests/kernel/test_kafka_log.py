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


def test_sie_kafka_debug_puts_librdkafka_debug_lines_in_the_process_log(monkeypatch, caplog):
    """SIE_KAFKA_DEBUG=eos,protocol: every client asks librdkafka for those contexts, and its debug lines (level
    7, logged at DEBUG) pass the repeat filter and the logger's level: an incident can be read afterwards."""


    logger = logging.getLogger("sie.kafka")
    saved = logger.level
    logger.setLevel(logging.WARNING)  # what `sie score --log-level info` sets
    try:
        _debug_lines_logged(monkeypatch, caplog, logger)
    finally:
        logger.setLevel(saved)


def _debug_lines_logged(monkeypatch, caplog, logger) -> None:
    from confluent_kafka import Producer

    from sie.kernel.settings import Settings

    monkeypatch.setenv("SIE_KAFKA_DEBUG", "eos, protocol")
    settings = Settings(bootstrap_servers="127.0.0.1:1")  # nothing listens: librdkafka logs its tries
    config = settings.kafka_client_config(**{"transactional.id": "debug-test", "socket.timeout.ms": 1000})
    assert config["debug"] == "eos,protocol" and logger.level == logging.DEBUG
    f = RepeatFilter()
    same = [_record(f"Sent InitProducerIdRequest (v4, {i} bytes)", logging.DEBUG) for i in range(5)]
    assert all(f.filter(r) for r in same)  # debug lines are never held back as "similar"
    with caplog.at_level(logging.DEBUG, logger="sie.kafka"):
        producer = Producer(config)
        try:
            producer.init_transactions(0.5)
        except Exception:  # noqa: BLE001 - nobody answers: the lines logged on the way are what is checked
            pass
        producer.poll(0)
    assert any(r.levelno == logging.DEBUG and r.name == "sie.kafka" for r in caplog.records), "no debug line logged"


def test_sie_kafka_debug_names_the_contexts_it_accepts(monkeypatch):
    import pytest
    from pydantic import ValidationError

    from sie.kernel.settings import Settings

    monkeypatch.setenv("SIE_KAFKA_DEBUG", "eos,protocl")
    with pytest.raises(ValidationError, match="protocl"):
        Settings()
    monkeypatch.delenv("SIE_KAFKA_DEBUG")
    assert "debug" not in Settings().kafka_client_config()
