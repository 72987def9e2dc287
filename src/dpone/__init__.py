"""dpone: full-refresh snapshots of SQL Server tables into ClickHouse, with proof."""

__version__ = "0.1.0"
