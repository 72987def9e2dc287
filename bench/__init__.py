"""Benchmarks: scripts that print figures and ratios against a same-run baseline."""

from pathlib import Path


def compile_bytecode() -> None:
    """Compile dpone's bytecode before timing, as an installed package has it.

    Where PYTHONDONTWRITEBYTECODE is set (as on the machines here), an editable install
    would otherwise compile every module it imports on every run: 0.3 s of each step.
    """
    import compileall

    import dpone

    compileall.compile_dir(Path(dpone.__file__).parent, quiet=1)
