"""The ``dpone`` command line: thin commands over the library."""
