"""Workers on this machine in one line: :class:`~shardline.transport.local.pool.LocalPool`
starts worker processes (:mod:`~shardline.transport.local.worker`) serving the caller's
handlers over either transport, and dispatches to them."""
