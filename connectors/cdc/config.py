"""The CDC connector spec (``sie.schemas.connector_spec``, re-exported here) and reading it from a file."""

from __future__ import annotations

from pathlib import Path

import yaml

from sie.schemas.connector_spec import (
    DEFAULT_ID_TEMPLATE,
    ID_FIELDS,
    CdcConnectorSpec,
    CdcFormat,
    ConnectorSpecError,
    Operation,
    parse_connector_spec,
)

__all__ = ["DEFAULT_ID_TEMPLATE", "ID_FIELDS", "CdcConnectorSpec", "CdcFormat", "ConnectorSpecError", "Operation",
           "load_connector_spec", "parse_connector_spec"]


def load_connector_spec(path: str | Path) -> CdcConnectorSpec:
    """Read and validate a connector spec from a YAML (or JSON) file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConnectorSpecError(f"{p}: cannot read connector spec ({exc.strerror})") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConnectorSpecError(f"{p}: not valid YAML ({exc})") from None
    return parse_connector_spec(doc, source=str(p))
