"""The authority: the publication's evidence reopened, its principals issued and closed.

:class:`~dpone.publication.authority.snapshot_authority.SnapshotAuthority` implements
the authority port: ``reopen`` reads the staging journal's evidence from disk
(``journal_evidence``); ``close_principal`` acts on one lease (``lease_scope``: its
window, its query-id marks, its sessions), drains the lease's HTTP sessions
(``session_drain``) and accounts for its open sign-ins (``login_account``), and
records the proof whether or not it held.
"""
