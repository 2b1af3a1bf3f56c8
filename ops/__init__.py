import kvlease.common  # noqa: F401  (first: it settles gRPC's fork setting before anything imports grpc)
