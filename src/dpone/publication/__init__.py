"""Publication: a verified generation made the target in one reconciled EXCHANGE."""
