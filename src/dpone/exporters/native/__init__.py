"""The compiled renderer's C source (``render.c``) and the extension module built from it."""
