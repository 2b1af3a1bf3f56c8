"""``python -m kvlease.ops …`` is the ``kvlease`` command."""

from kvlease.ops.cli import main

main()
