"""The source documents' module names, kept importable: each re-exports its room's module."""
