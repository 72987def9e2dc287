"""SQL text helpers: the one place where identifiers and literals are escaped."""

from dpone.sql.quoting import quote_identifier, quote_literal

__all__ = ["quote_identifier", "quote_literal"]
