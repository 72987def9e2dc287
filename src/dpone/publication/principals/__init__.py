"""Principals: who dpone is on a ClickHouse server, and which server that is.

The server a project works on and the credentials it signs in with
(``server_access``); the issuers that lease or create the ingest and publisher
principals (``principal_issuers``); the proof, before any work, that the pool installed
on the server is what dpone needs (``pool_verify``, its query logging:
``pool_logging``); the end of a password rotation (``pool_rotation``); and which store
owns a pool and a target slot, as the server records it (``ownership``).
"""
