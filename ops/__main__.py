"""``python -m ops …`` is the ``kvlease`` command."""

from ops.cli import main

main()
