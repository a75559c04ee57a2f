"""``python -m rigidjax``: the same command line as the ``rigidjax`` console script."""

from .cli import run

run()
