"""Infrastructure SIE ships: local Kafka fetch-and-run (``sie.infra.kafka``), Prometheus rules and Grafana
dashboards (package data under ``prometheus/`` and ``grafana/``)."""
