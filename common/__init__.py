"""What every kvlease process shares (config, ZooKeeper, storage, wire formats, security).

Importing it first also settles one gRPC setting: since grpcio 1.81, a child forked with fork
handlers (``subprocess`` with ``preexec_fn``: PySpark's Java gateway, the JVMs our tools start with
``PR_SET_PDEATHSIG``) can crash before its ``exec`` while gRPC restarts its poller thread in it
(grpc/grpc#43055; measured here: 4 of 300 such children died). No kvlease process uses gRPC across
a fork, so gRPC's fork support is turned off unless the environment says otherwise. gRPC reads the
setting when it is first imported: each package that uses gRPC imports this one before it.
"""

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
