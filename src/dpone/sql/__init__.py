"""SQL text helpers: the one place where identifiers and literals are escaped."""

from dpone.sql.quoting import in_list, quote_identifier, quote_literal

__all__ = ["in_list", "quote_identifier", "quote_literal"]
