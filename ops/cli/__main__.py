"""``python -m kvlease.ops.cli …`` is the ``kvlease`` command."""

import sys

from kvlease.ops.cli import main

main(sys.argv[1:])
