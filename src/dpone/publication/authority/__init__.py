"""The authority: the publication's evidence reopened, its principals issued and closed.

:class:`~dpone.publication.authority.snapshot_authority.SnapshotAuthority` implements the
authority port: ``reopen`` reads the staging journal's evidence from disk
(``journal_evidence``); ``close_principal`` proves one lease quiet and
``close_principals`` several at once (``closure``, with ``lease_scope``,
``session_drain``, ``login_account`` and the closer's shared ``closure_reads``), and
each proof is recorded whether or not it held.
"""
