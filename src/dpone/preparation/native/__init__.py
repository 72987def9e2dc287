"""dpone's compiled parts (C, built by ``scripts/bootstrap.sh``, loaded with ctypes)."""
