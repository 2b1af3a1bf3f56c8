"""Users, authentication and ACLs (docs/architecture.md, "Security").

Pure cores: :mod:`.passwords` (salted hashes), :mod:`.authn` (checking
credentials against a user lookup), :mod:`.acl` (the ACL model and the
:class:`~.acl.Authorizer`). Shells: :mod:`.watched` (a ZooKeeper directory
mirrored in memory by watches), :mod:`.users` and :mod:`.acl_store` (the
stores and their watch-driven caches), :mod:`.grpc_auth` (the gRPC
interceptors). Not wired into the servers yet.
"""
