"""Helpers shared by test modules, loaded as pytest plugins by ``tests/conftest.py``.

A test module never imports from another test module or from ``conftest.py``: a shared
fixture lives here (a test names it as a parameter), and a shared function or constant
is imported from here (``from tests.plugins.cli import dpone``).
"""
