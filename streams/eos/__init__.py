"""The exactly-once layer (KIP-447 consume-transform-produce), shared by every stage that writes to Kafka."""

from sie.streams.eos.cycle import (
    BatchStatus,
    EosLimits,
    ExactlyOnce,
    TransactionFenced,
    close_quietly,
    start_producer,
)

__all__ = ["BatchStatus", "EosLimits", "ExactlyOnce", "TransactionFenced", "close_quietly", "start_producer"]
