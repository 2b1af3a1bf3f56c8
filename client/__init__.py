"""Everything a user process needs to talk to a kvlease cluster, and nothing of the servers."""

import kvlease.common  # noqa: F401  (first: it settles gRPC's fork setting before anything imports grpc)
