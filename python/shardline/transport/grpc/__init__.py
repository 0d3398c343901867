"""The gRPC transport (the ``grpc`` extra): the caller's
:class:`~shardline.transport.grpc.connection.GrpcConnection` over channels shared per address,
the worker's :func:`~shardline.transport.grpc.server.serve_grpc`, and the JSON wire between
them. Nothing is imported here: :mod:`~shardline.transport.grpc.wire` needs no gRPC, so
reading a ``grpc://`` address needs no extra."""
