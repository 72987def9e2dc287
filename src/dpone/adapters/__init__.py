"""Concrete implementations of the ports: journals, stores, catalogs."""
