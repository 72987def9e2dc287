"""A SQL Server source's secrets: now read by its kind (:mod:`dpone.exporters.sources.mssql`)."""

from dpone.exporters.sources.mssql import resolve_secret

__all__ = ["resolve_secret"]
