"""``python -m kvlease …`` is the ``kvlease`` command."""

from kvlease.ops.cli import main

main()
