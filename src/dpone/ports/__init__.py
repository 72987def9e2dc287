"""The protocols services depend on, documented once; adapters need not inherit."""
