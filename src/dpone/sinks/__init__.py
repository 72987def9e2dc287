"""The source document's ``sinks.ClickHouseSink``: the staging sink, importable here."""

from dpone.staging.sink import ClickHouseSink

__all__ = ["ClickHouseSink"]
