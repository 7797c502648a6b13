"""Code that runs INSIDE a sandbox: the execution server and its tools.

This package is bind-mounted read-only into every sandbox and run with the image's own
python3, so it must use only the standard library (plus ptyprocess, mounted next to it),
relative imports, and syntax that Python 3.8 understands. Nothing here may import the
host-side `orchestrator` package.
"""
