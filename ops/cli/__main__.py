"""``python -m ops.cli …`` is the ``kvlease`` command."""

import sys

from ops.cli import main

main(sys.argv[1:])
