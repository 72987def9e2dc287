"""Dispatch: the publication's mutations, each sent once as the publisher, under its gate.

The executor (``executor``) renders ``CREATE``, ``EXCHANGE TABLES`` and the drop of a
created target and sends each once; the gate (``dispatch_gate``, held on a PostgreSQL
store as an advisory lock: ``postgres_locks``) serializes a dispatch against the closure
of its principal; the notes (``dispatch_notes``) record what a dispatch did with its
drain-gate session, for the closure to read.
"""
