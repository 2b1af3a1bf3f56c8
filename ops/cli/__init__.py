"""The ``kvlease`` command line (console script ``ops.cli:main``).

:mod:`ops.cli.app` holds the root group, the state the commands share and
:func:`main`; :mod:`ops.cli.values` parses values from text; every other
module is one command group and adds its commands to the root group when it
is imported, which this package does below.
"""

import os

# gRPC core logs each failed TLS handshake on stderr at INFO; the CLI's one-line error already says so.
# It reads this when grpc is first imported, which the imports below do.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from ops.cli import bucket, bucket_loss, bucket_moves, changelog, cluster, cluster_moves, data, demo, lease, plugins, scan, security, snapshot, table  # noqa: E402,F401  (they add the commands)
from ops.cli.app import State, kvlease, main  # noqa: E402

__all__ = ["State", "kvlease", "main"]
