"""The MessagePack-RPC transport (the default; the ``msgpack`` extra; the protocol is in
``docs/msgpack-rpc.md``): the caller's
:class:`~shardline.transport.msgpack.connection.MsgpackConnection` and the worker's
:func:`~shardline.transport.msgpack.server.serve_msgpack`, the wire both read and write,
streamed calls, and what a worker does to bound its clients (connection churn, TLS
handshakes). Nothing is imported here, so naming a module of this package needs no extra
until that module is imported."""
