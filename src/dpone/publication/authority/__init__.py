"""The authority: the publication's evidence reopened, its principals issued and closed.

:class:`~dpone.publication.authority.snapshot_authority.SnapshotAuthority` implements the
authority port: ``reopen`` reads the staging journal's evidence from disk
(``journal_evidence``); ``close_principal`` proves one lease quiet (``lease_scope``,
``session_drain``, ``login_account``) and records the proof whether or not it held.
"""
