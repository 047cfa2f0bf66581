"""The exactly-once layer (KIP-447 consume-transform-produce), shared by every stage that writes to Kafka.

Nothing in here imports a user of it.  Pieces, bottom up:

* ``bounded``     a watchdog for client calls that can block past their own timeout;
* ``errors``      the named outcomes (``TxnAbortable``, ``ProducerFatal``, ``RetryLater``, ``Fenced`` ...);
* ``transaction`` ``TransactionalProducer`` (error policy, watchdog, re-creation) and ``Checkpoint`` (one
                  batch's transaction, committed in numbered steps), ``rewind``, ``close_quietly``;
* ``cycle``       ``ExactlyOnce``: the batch cycle and its recovery paths, written once; serial (``run_batch``)
                  or pipelined (``start_batch``/``settle``: a batch's commit overlaps the next batch's work);
* ``batcher``     micro-batching outside any transaction;
* ``stage``       ``StreamLoop``: a whole consume-process-commit stage, the one exactly-once loop (the scorer, the
                  CDC stage; bounded runs: backfill, redrive; windowed: the LLM stage);
* ``ranges``      bounded runs of ``StreamLoop``: fixed offset ranges, stopped at their ends, a ``Throttle``;
* ``windowed``    windowed stages of ``StreamLoop``: records in flight across polls, their finished prefix committed;
* ``records``     ``Output``/``Prepared``: a batch's outputs, prepared outside the transaction;
* ``deadletter``  dead letters written the same way by every stage, always fitted to the size limit;
* ``lag``         consumer lag for the ``*_consumer_lag`` gauges.
"""

from sie.streams.eos.cycle import (
    PIPELINED_DEFAULT,
    BatchOutcome,
    BatchStatus,
    BatchTimes,
    EosLimits,
    EosObserver,
    ExactlyOnce,
    start_producer,
)
from sie.streams.eos.errors import (
    ConsumerFatal,
    EosError,
    Fenced,
    OutcomeUnknown,
    ProducerFatal,
    ProducerHung,
    RecordRejected,
    RetryLater,
    TxnAbortable,
)
from sie.streams.eos.ranges import RangeRun, Throttle
from sie.streams.eos.records import Output, Prepared, safe_headers
from sie.streams.eos.stage import BatchProcessor, StageSettings, StopRequest, StreamLoop, leaves_group
from sie.streams.eos.transaction import Checkpoint, TransactionalProducer, close_quietly, rewind
from sie.streams.eos.windowed import WindowedProcessor

__all__ = [
    "BatchOutcome", "BatchProcessor", "BatchStatus", "BatchTimes", "Checkpoint", "ConsumerFatal", "EosError", "EosLimits", "EosObserver",
    "ExactlyOnce", "Fenced", "OutcomeUnknown", "Output", "Prepared", "ProducerFatal", "ProducerHung", "RangeRun", "RecordRejected",
    "RetryLater", "StageSettings", "StopRequest", "StreamLoop", "Throttle", "TransactionalProducer", "TxnAbortable",
    "WindowedProcessor", "close_quietly", "PIPELINED_DEFAULT", "leaves_group", "rewind", "safe_headers", "start_producer",
]
