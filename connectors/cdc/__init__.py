"""CDC adapters: Canal flatMessage, Debezium JSON and Maxwell JSON row changes
turned into SIE scoring requests.

Pipeline (per Kafka record): ``decode_<format>(key, value)`` -> ``DecodeResult``
(``rows`` of ``RowChange`` | ``skipped`` reason | raises ``CdcDecodeError``) ->
``CdcConverter`` filters (tables, operations, unchanged updates), maps columns to
model inputs, coerces to the model's field types and builds requests with
replay-stable ids.  Casting rules: ``sie.connectors.cdc.casting``; spec:
``sie.connectors.cdc.config``; request shape: ``sie.connectors.cdc.to_requests``.
"""

from sie.connectors.cdc.canal import decode_canal
from sie.connectors.cdc.config import CdcConnectorSpec, ConnectorSpecError, load_connector_spec, parse_connector_spec
from sie.connectors.cdc.debezium import decode_debezium
from sie.connectors.cdc.maxwell import decode_maxwell
from sie.connectors.cdc.model import (
    CdcDecodeError,
    CdcErrorReason,
    DecodeOptions,
    DecodeResult,
    Op,
    RowChange,
    SkipReason,
    format_pk,
)
from sie.connectors.cdc.to_requests import CdcConverter, ConversionOutcome, ConvertedRequest, rows_to_requests

__all__ = [
    "CdcConnectorSpec", "CdcConverter", "CdcDecodeError", "CdcErrorReason", "ConnectorSpecError",
    "ConversionOutcome", "ConvertedRequest", "DecodeOptions", "DecodeResult", "Op", "RowChange", "SkipReason",
    "decode_canal", "decode_debezium", "decode_maxwell", "format_pk", "load_connector_spec",
    "parse_connector_spec", "rows_to_requests",
]
