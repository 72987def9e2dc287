"""Sinks: where validated files go."""

from dpone.sinks.clickhouse import ClickHouseSink

__all__ = ["ClickHouseSink"]
