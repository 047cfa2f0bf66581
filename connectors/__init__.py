"""Edges: JSON producer, CDC adapters (Canal, Debezium, Maxwell), backfill/replay."""
