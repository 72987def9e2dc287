"""Services and state machines: validation, preparation, staging, publication."""
