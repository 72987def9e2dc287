"""Ceilings: the publication's storage limits, as staging's bounds and as retained storage.

``stream_ceilings`` turns a publication's ceilings into staging's streaming bounds and
names the ceiling behind a bound that stopped a stream; ``retained`` says which tables
of a database count as retained (their UUIDs recorded by the store) and narrows
staging's byte bound to the headroom the total transient ceiling leaves.
"""
