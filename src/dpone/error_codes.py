"""The stable code of every error dpone raises, with what it means: one registry.

Every :class:`dpone.errors.DponeError` carries a ``code``; each line of :data:`_TABLE`
is ``code: meaning``, written from what the raising code does, and lists the codes a
raiser composes too. ``tests/unit/test_error_codes.py`` holds it to the source and to
``docs/errors.md``, which :func:`errors_markdown` writes (``scripts/errors_md.py``). See
docs/architecture.md ("An error code").
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["ERROR_CODES", "errors_markdown", "meaning"]

# One line per code, sorted: "code: meaning" (one line, at most 100 characters).
_TABLE = """\
address_drift: the host resolves (or connected) to another address than the pinned one; nothing sent
admin_query_failed: a query of the managed server's administrator failed or answered an HTTP error
admission_conflict: the attempt is already admitted for another target slot
admission_not_found: no run is admitted under the parent request named
advisory_lock_lost: a PostgreSQL advisory lock was gone when its block ended (its session was ended)
ambiguous_endpoint: the ClickHouse host resolves to several addresses; dpone needs exactly one
ambiguous_sqlite_type: a SQLite declared type that is ambiguous; the message names what to declare
artifact_busy: the validated file is held by another active attempt
artifact_changed_during_preparation: the file changed after verification, while it was converted
artifact_changed_during_scan: the file changed (size or content) while it was validated or verified
artifact_hash_mismatch: the file's SHA-256 differs from its receipt's
artifact_mismatch: the file is not the one its receipt describes (the default)
artifact_replaced: the file was removed, renamed or replaced by another file
artifact_size_mismatch: the file's size differs from its receipt's
attempt_busy: the attempt id is already active in another process; an attempt runs once
attempt_exists: an attempt of that id already has a journal in the work directory
attempt_fenced: the attempt is not admitted, or admitted for another run, slot or slot epoch
attempt_id_mismatch: the attempt directory holds the journal of another attempt; nothing done
attempt_not_active: an attempt's completion was recorded while the attempt is not the active one
attempt_not_found: the path is not an attempt directory (no events directory); nothing done
attempt_outside_work_dir: the attempt directory is a link out of the work directory; nothing done
attempt_running: a process still has the attempt's directory open; nothing done
attempt_used: the run's attempt already has a publication intent; a new one needs a new attempt
authentication_refused: ClickHouse refused the sign-in (AUTHENTICATION_FAILED); details give the fix
authority_error: the publication authority refused (the default)
body_limit_exceeded: a query's body is over its byte ceiling (refused before sending, or while sent)
bulk_text_error: a bulk text file or value does not follow the format (the default)
byte_observation_missing: a table's byte counter is NULL; a missing counter is never read as zero
ca_file_unreadable: the CA file configured for TLS cannot be read
catalog_unobservable: the catalog cannot observe what it must (a table changed, grants hide some)
chdb_not_installed: the interpreter that would run the managed server cannot import chdb
claim_exists: the intent is not PREPARED (cancel), or is claimed with no outcome recorded: reconcile
claim_lost: the claim's compare-and-set lost: the stored record is not at the expected revision
claim_moved: under the dispatch gate, the record is no longer the claim EXCHANGE_INTENT@2
claim_uncertain: the claim's write has an unknown outcome or cannot be read back; nothing was sent
cleanup_failed: a cleanup step ran and failed (DROP refused, the table remains, or after a query)
clickhouse_error: the ClickHouse server answered with an exception (its number in details)
client_cannot_run: clickhouse-client cannot be started; nothing was sent
client_failed: clickhouse-client exited with an error; the query's outcome is unknown
client_killed: clickhouse-client was killed by a signal; the query's outcome is unknown
client_missing: clickhouse-client was not found at the configured path; nothing was sent
client_not_executable: clickhouse-client is not executable by this user; nothing was sent
client_not_found: clickhouse-client was not found for the command; install it or pass --client-path
client_probe_deadline: clickhouse-client --version outlived the caller's deadline; nothing was sent
client_unusable: the configured clickhouse-client cannot be run or asked its version (the default)
client_version_unknown: clickhouse-client did not say its version
closure_account_malformed: the closure's query-log account answered an unexpected shape
closure_sample_malformed: the closure's process sample, sign-in count or server start was malformed
closure_unproven: a lease's principal is not proven closed; nothing was done, run again later
config_exists: dpone init found the project file already there; it never overwrites one
config_missing: there is no project file at the path; dpone init writes an example
config_not_a_file: the project file path is not a regular file
config_unreadable: the project file cannot be read
config_unwritable: dpone init cannot write the project file
configuration_error: something cannot work as configured (the default)
confirmation_required: a retire would drop tables; nothing done until the named command is run
conflicting_server: --config names the server, so --host is refused
connect_failed: the connection to ClickHouse could not be made; nothing was sent
connection_lost: the connection broke during the query; its outcome is unknown
content_mismatch: the table's rows or content digest differ from what was staged or recorded
control_row_incomplete: a control read returned a row without a member it needs
count_mismatch: a row count differs from the receipt's or from the prepared rows
count_unobservable: a COUNT did not return one integer
cr_not_allowed: a raw CR in a text field of the bulk text file (text must escape it)
create_target_failed: creating the empty target table was not acknowledged
credentials_corrupt: the managed server's credentials file cannot be read or parsed
credentials_file_exposed: the pool's credentials file may be read by others; make it private
credentials_file_incomplete: the pool's credentials file lacks principals; render the pool again
credentials_file_unreadable: the pool's credentials file is missing or cannot be read
credentials_in_dsn: a source DSN carries credentials; they come from the environment
credentials_missing: the data directory has no credentials file, or no entry for a user
dangling_escape: a bulk text field ends in a lone U+001D
data_dir_not_writable: the managed server's data directory cannot be created or written
database_in_two_pools: one database is protected by two pools; each belongs to one
database_mismatch: the database is another than the one recorded or staged into (another server?)
database_missing: the database does not exist (or this user may not see it)
database_not_atomic: the database's engine is not Atomic, which EXCHANGE and the UUID proofs need
database_not_protected: the publication pool does not protect the target database (no grants there)
database_not_replaced: the intent's database is not proven dropped on the server it was staged on
deadline_expired: an absolute deadline expired (the default)
demo_mismatch: the demo's target does not equal its source
design_changed: the source's columns no longer match the target; nothing was exported
design_mismatch: the target and the generation (or rollback copy) differ in physical design
design_unrenderable: the generation's columns hold what the empty target's CREATE cannot reproduce
design_unsupported: the target's engine or keys cannot be reproduced by a MergeTree generation
discard_already_sent: the attempt already sent its discard and the table remains
discard_unknown: the discard's outcome is unknown; the journal stays at discarding
dispatch_gate_busy: the dispatch gate stayed held by another holder for the whole wait
dispatch_refused: a re-check under the dispatch gate refused; nothing was sent (the default)
dispatch_unverified: the lease, claim or side effects could not be read before dispatch; not sent
dpone_error: the root error's default code
driver_not_installed: a source's driver is missing: install its extra (mssql, postgres)
drop_already_sent: the attempt already sent its DROP and the table remains
drop_unverified: the table still exists after its DROP
duplicate_column: a schema declares a column twice
duplicate_database: a protected database is named twice in the pool
duplicate_member: a JSON object has a duplicate member
duplicate_user: a server user is declared twice
empty_name: a schema column's name is empty
empty_schema: a schema has no columns
endpoint_changed: the endpoint answers as another server or database than when the work began
endpoint_identity: the endpoint has no usable identity, or the database is not what dpone needs
endpoint_mismatch: the endpoint is not the server or database the attempt's journal bound
engine_version_unsupported: the installed embedded engine is not the version dpone is tested with
engine_wait_not_found: the engine's waiting statement is not running (not exactly one found)
evidence_unverified: the staging evidence (journal) is missing or does not verify
exception_after_status: ClickHouse sent an exception after its HTTP status line
executor_error: a dispatch was refused before anything was sent (the default)
export_exists: the export's output exists and is not one this refresh wrote; it is not replaced
float_not_allowed: canonical JSON holds a float or non-integer number
format_error: input bytes do not follow the declared format (the default)
free_space_reserve: free space fell below the preparation's reserve
generation_unobservable: the generation is not one table with an engine, or shows no columns
hand_over_to_self: a hand-over named this project's own store as the old one
history_unverified: a publication's record chain does not verify from its bytes
holders_unknown: whether a process still uses the directory cannot be told (no /proc)
host_not_found: the ClickHouse host name cannot be resolved; nothing was sent
identity_unavailable: the server has a Nil UUID and dpone's identity database is missing or unusable
identity_unobservable: an identity query did not return the one well-formed row expected
incomplete_endpoint: --host was given without --http-port and --tcp-port
ingest_logins_unobservable: the session log cannot be read to prove the ingest principal's sign-ins
ingest_not_quiescent: the ingest principal is not proven closed and quiescent
ingest_ungated: the generation was staged without a drain gate (a transport that has none)
intent_exists: the publication intent is already stored
invalid_attempt_id: an attempt id does not match the allowed pattern
invalid_body_limit: a query's max_body_bytes is not a byte count
invalid_config: the project file is missing, not TOML, or has problems (listed in details)
invalid_control_output: a control or query-log answer has an unexpected shape or types
invalid_count: a count given to the file artifact is not an integer
invalid_counter: a document's counter is negative or not an integer
invalid_credentials: a ClickHouse user or password is empty, not UTF-8, or has control characters
invalid_database: a protected database is not a plain identifier, or is a reserved one
invalid_design: a staging design uses another engine, key expression or setting than allowed
invalid_digest: a document's digest is not the expected lowercase hex
invalid_document: a document field is empty or inconsistent with the others
invalid_dsn: a source DSN cannot be read (scheme, path, host, database or port)
invalid_grant: a server user's grant is not a GRANT statement
invalid_hex: a binary bulk text field is not hex byte pairs
invalid_host: a principal's host is missing or not an IP address or network
invalid_intent_id: INTENT is not the 64 lowercase hex digits prepare printed
invalid_mode: the preparation mode is not one dpone knows
invalid_mutation_kind: a mutation's kind is not one dpone knows
invalid_ownership_transition: a run's ownership cannot move between the states asked
invalid_password_hash: a password hash is not 64 lowercase hex digits
invalid_policy: a staging policy number is not positive, finite or whole as required
invalid_pool: a pool name or --pool option is not valid
invalid_profile_name: a server user's profile name is not a plain identifier
invalid_session: an HTTP session id or its timeout/check settings are not valid
invalid_source_type: a declared SQL Server type cannot be read (name or parameters)
invalid_table_name: a table name is empty, holds NUL or is not valid UTF-8
invalid_target: --target is not DATABASE.TABLE
invalid_timestamp: a document's time is not a UTC ISO 8601 time
invalid_transition: a staging or snapshot state cannot move to the state asked
invalid_transport: the staging transport is not one of the explicit choices
invalid_user_name: a server user name does not match the allowed pattern
invalid_utf8: a text bulk text field is not valid UTF-8
invalid_uuid: a document's UUID is not lowercase and non-nil
invalid_value: the type policy's reference converter refused a value (see its message)
journal_chain_broken: a journal event does not chain to the one before it
journal_diverged: the events directory holds an event this journal did not publish
journal_empty: the attempt's journal holds no event (it sent nothing); archive it
journal_error: a durable record could not be written or does not verify (the default)
journal_head_mismatch: the journal does not end at the expected head event
journal_invalid: a journal event lacks its envelope or belongs to another attempt
journal_missing: the attempt directory has no events directory
journal_noncanonical: a journal event is not canonical JSON
journal_not_empty: the attempt has journal events, so it is not archived; finish it first
journal_sequence_gap: a journal event is missing or out of sequence
journal_storage_low: the journal's storage lacks free bytes or inodes for the write
journal_storage_unknown: the journal's storage cannot be examined; nothing was written
journal_storage_unwritable: the journal's storage cannot be written; nothing was written
journal_unconfirmed_event: an event was written but never confirmed, and cannot be taken back
journal_unreadable: an attempt journal cannot be read
journal_write_failed: a journal event could not be written, published or moved aside
lease_ended: the lease is no longer active, or not the intent's publisher
lease_holder_live: the lease's holder can still use it (live), so it is not ended; nothing written
lease_holder_unknown: the lease's holder is not proven gone, so it is not ended; nothing written
lease_not_found: no such lease is in the store
limit_exceeded: an observed size exceeds (or leaves no room under) its configured ceiling
local_io_failed: a local file operation of a staging attempt failed
local_server_error: the managed server could not be started, found or stopped (the default)
lone_surrogate: a string holds a lone surrogate, which UTF-8 cannot encode
misplaced_empty_marker: the empty-string marker U+001D E is not the whole bulk text field
missing_credentials: the source's user or password variable (or file) is not set
missing_final_lf: the bulk text file does not end in LF: its last record is incomplete
missing_member: a document lacks a required member
native_port: the HTTP port answered as ClickHouse's native port; nothing was run
native_unavailable: the compiled converter failed to run (a fault of its own, not a decline)
networks_invalid: the pool's networks are missing or not IP addresses or CIDR blocks
nil_database_uuid: the database has the Nil UUID
no_columns: a bulk text reader was given no columns
no_databases: the pool protects no database
no_rollback_copy: there is no rollback copy (never published, first publication, or dropped)
no_server: no managed server runs on the data directory and no --host was given
no_tables_selected: refresh was given no table names and no --all
no_users: the managed server config declares no user
noncanonical_json: bytes or values that are not canonical JSON (the default)
not_a_file: the file is not a regular file
not_a_sqlite_database: the SQLite source's file is not a SQLite database
not_abandonable: only an unresolved claim whose database was dropped is abandoned
not_native_port: the TCP port does not speak ClickHouse's native protocol; nothing was sent
not_remote: the command is for a server named with host, not the managed local one
not_staged: the attempt is not staged, so there is nothing to discard
not_submitted: the request was never sent (the default)
nothing_to_clean: the attempt ended, so there is nothing to clean
null_not_allowed: NULL in a column declared NOT NULL
origin_unrecorded: a query's intent lacks the principal, database and window to tell its log entries
outcome_unknown: the request may have run: the connection broke after sending began
output_budget_exceeded: clickhouse-client wrote more output than its cap
output_directory_missing: the directory of an output does not exist
output_exists: an output exists (or appeared while written); --force replaces it
output_is_directory: an output path is a directory
output_is_input: an output is one of the inputs; it is not overwritten
output_not_accessible: an output path cannot be inspected
output_refused: an output would destroy an input, another output or a file (the default)
output_write_failed: an output file could not be written or put in place
outputs_collide: two outputs are the same file
override_not_allowed: a column's type override is not a wider type of the same family
owned_elsewhere: a pool or target slot belongs to another store (the default)
ownership_not_active: the run's ownership is not active
ownership_not_retained: the intent's run no longer retains its slot
ownership_unverified: a table's ownership mark is not the expected one; it is not dropped
phase_deadline: a staging phase's deadline expired
pinned_setting: a query's settings conflict with those dpone pins
pinned_settings_not_sent: this clickhouse-client cannot send the pinned settings; not sent
pinned_settings_unproven: the pinned settings could not be proven on the server; not sent
policy_error: a value or schema is outside the type policy (the default)
pool_exhausted: every principal of the role is leased
pool_incomplete: pool users lack credentials or ids
pool_missing: the server has no publication pool for the configured pool
pool_needs_managed_server: --principal pool needs the managed local server
pool_owned_elsewhere: the pool on the server belongs to another project's store
pool_passwords: pool passwords are missing, or name users not in the pool
port_in_use: a requested port is already bound by another process
ports_must_differ: the managed server's HTTP and TCP ports are the same
postgres_not_installed: a PostgreSQL store needs psycopg (the postgres extra)
preparation_deadline: the preparation's deadline expired
preparation_failed: preparation stopped and its partial spool was removed (the default)
preparation_mode_removed: the preparation mode was removed; details name its replacement
prepare_uncertain: storing the intent and its PREPARED record has an unknown outcome
principal_error: a principal cannot be issued, handed out or revoked (the default)
principal_leased: the principal holds a lease; end and close it first
principal_mismatch: the principal or lease is not the one the intent or credentials name
principal_not_active: the principal's lease has ended
principal_not_retirable: the principal cannot be retired (its role, or the last of its role)
principal_unknown: a user is not in the pool or not declared on the server
principals_not_distinct: the ingest and publisher principals are the same user
protected_record_corrupt: the record of protected databases cannot be read or parsed
publication_commit_unknown: the publication ended COMMIT_UNKNOWN; reconcile it
publication_error: a publication step was refused or its outcome is unknown (the default)
publication_exchange_intent: the publication stopped at its claim EXCHANGE_INTENT; reconcile it
publication_not_published: the publication ended NOT_PUBLISHED; the target is unchanged
publication_unfinished: the slot has an unfinished publication; resolve it first
publisher_logins_unobservable: the session log cannot be read to prove the publisher's sign-ins
query_id_mismatch: the response names another query id than the one sent
query_log_restore_failed: the saved query log of the managed server cannot be restored
readback_mismatch: the claim reads back different bytes; nothing was dispatched
receipt_codec_mismatch: the receipt was made with another bulk text codec version
receipt_policy_mismatch: the receipt was made with another type policy version
receipt_replaced: the receipt file is gone or was replaced during the attempt
receipt_rows_mismatch: the file has another number of records than its receipt says
receipt_unreadable: the receipt file cannot be read
receipt_validator_mismatch: the receipt was made by another validator; validate the file again
record_too_large: a bulk text record is longer than its byte budget
redirect_refused: ClickHouse answered with an HTTP redirect, which is refused
refresh_busy: another refresh or rollback of the table runs now
refresh_failed: a refresh step refused to go on (the default)
reserved_character: a field holds a reserved character (raw, or in a non-text field)
reserved_user: the user name is reserved on the managed server
response_bad_chunk_size: the HTTP response has an invalid chunk size
response_bad_chunk_terminator: an HTTP response chunk is not terminated by CRLF
response_bad_framing: the HTTP response's framing is unsupported or contradictory
response_bad_header: the HTTP response has a malformed header line
response_bad_line_terminator: an HTTP response line does not end in CRLF
response_bad_status_line: the HTTP response's status line is malformed
response_body_budget_exceeded: the HTTP response body exceeds its budget
response_metadata_budget_exceeded: the HTTP response's status line or headers exceed their budget
response_truncated: the HTTP response ended before its framing said
retention_refused: a rollback copy could not be proven to be what the store says (the default)
retention_unknown: a retention DROP has an unknown outcome; its journal stays at discarding
retire_refused: a retire refused or could not finish (the default)
retirement_superseded: the slot was published into after its retirement began
rollback_refused: a rollback refused (the default)
rotation_not_installed: the server does not take the rotation's new passwords yet
rotation_pending: a pool rotation is not finished yet
row_count_mismatch: the prepared rows differ from the receipt's count
row_width_mismatch: a bulk text record has another number of fields than columns
schema_digest_mismatch: a receipt's schema digest does not match its schema
sent_bytes_mismatch: the bytes sent differ from the prepared spool's size or SHA-256
server_already_running: another managed server holds the data directory's lock
server_died_during_start: the managed server exited before it was ready
server_not_running: no running managed server was found for the data directory
server_start_timeout: the managed server was not ready before the start deadline
server_state_unknown: a server holds the data directory's lock but its ports are unknown
server_stop_timeout: the managed server did not stop within the bound, even after signals
server_too_old: the ClickHouse server is older than dpone supports
session_note_failed: a drain-gate note could not be written; the write was not sent
session_open_failed: the drain-gate session could not be opened; the write was not sent
session_unassignable: a write names no staging attempt, so it has no drain-gate session
session_unsupported: the client transport cannot carry the HTTP session a query needs
short_send: only part of the spool reached clickhouse-client
shrink_refused: the generation has fewer rows than the shrink guard allows; not published
side_effect_present: the target has a side effect the publisher does not handle
slot_blocked: the target slot has a publication whose outcome is not yet known
slot_owned_elsewhere: the target slot is published by another project's store
slot_unknown: the name is neither a table of the project nor a recorded target
snapshot_not_found: no snapshot intent of that hash is stored
source_connect_failed: dpone cannot connect to the source's server (SQL Server, PostgreSQL)
source_error: the source could not be read (the default)
source_kind_conflict: two source modules claim one kind or one DSN scheme
source_not_found: the SQLite source does not exist or is not a regular file
source_read_failed: the source cannot be read (or its connection was lost while it was read)
source_schema_changed: the source table's columns changed between its schema and its rows
spool_budget_exceeded: the spool would exceed its byte budget
spool_changed: the spool changed size while it was sent
spool_exists: the spool directory already exists
spool_mismatch: the spool on disk differs from what was written
spool_moved: the attempt's directory was moved or replaced by a link
spool_unreadable: the query's body (the spool) cannot be opened; nothing was sent
staging_evidence_missing: a rollback copy's staging journal is missing or does not verify
staging_failed: staging did not produce a verified table (the default)
state_error: an operation is not allowed in the current state (the default)
storage_budget_exceeded: the staging table holds more bytes on the server than its bound
store_busy: the PostgreSQL store stayed locked by another writer; nothing written
store_commit_unknown: a store write failed while committing or busy: its outcome is unknown
store_missing: there is no snapshot store where the project or server says
store_not_sqlite: the store file is not an SQLite database
store_schema_mismatch: the store is not a dpone snapshot store of this schema version
store_unavailable: the snapshot store cannot be reached, opened or read consistently
store_url_invalid: the PostgreSQL store URL is not one, or carries a password
stored_bytes_unobservable: the staging table's stored size cannot be observed
table_exists: the staging table already exists and is not this attempt's
table_identity_mismatch: the staging table fails its identity check
table_missing: the staging table is not observed exactly once
table_replaced: the staging table's UUID changed during the attempt
table_unobservable: what the server shows about a table could not be observed exactly
target_changed: the target is not the prepared one, or its row count is unobservable
termination_unproven: a sent query has no proven terminal state
tls_certificate_refused: the server's TLS certificate was refused; nothing was sent
tls_handshake_failed: the TLS handshake failed; nothing was sent
too_many_records: the bulk text file has more records than its budget
transport_cannot_carry_type: this clickhouse-client cannot send some column types; use HTTP
transport_deadline: the transport's absolute deadline expired (submitted says if bytes left)
transport_error: a ClickHouse request failed or its outcome is unproven (the default)
types_refused: the type policy refused several columns for different reasons
unencodable_value: a value cannot be written as bulk text for its column
unexpected_status: an HTTP status without a ClickHouse exception; the outcome is unknown
unknown_escape: a bulk text field has an unknown escape after U+001D
unknown_member: a document has members it does not define
unknown_override_column: a type override names a column the source table does not have
unknown_role: a pool role is not one dpone knows or issues
unknown_state: a record's state is not a snapshot state
unknown_table: a table named to refresh is not declared in the project
unreachable_state: a record's state and revision are not reachable by any transition
unsupported_type: a source type has no policy target or renderer
unsupported_version: a document is not of the kind or version this dpone reads
usage_error: the command's arguments contradict each other
value_not_renderable: a driver value has no exact canonical text for its column's type
value_not_representable: a cell the policy refuses; details name record, column and source
value_out_of_range: a source value outside what its ClickHouse type holds; names row and column
verification_budget_exceeded: a file verification scan passed its byte cap
verification_deadline: a file verification's deadline expired
work_dir_missing: the work directory is missing or was not given
wrong_type: a document member has the wrong JSON type
"""


def _parse(table: str) -> Mapping[str, str]:
    entries: dict[str, str] = {}
    for line in table.splitlines():
        code, _, text = line.partition(": ")
        entries[code] = text
    return MappingProxyType(entries)


ERROR_CODES: Mapping[str, str] = _parse(_TABLE)


def meaning(code: str) -> str | None:
    """What ``code`` means, or None for a code dpone does not raise."""
    return ERROR_CODES.get(code)


def errors_markdown() -> str:
    """The text of ``docs/errors.md``: every code and its meaning, from the registry."""
    lines = [
        "# Error codes",
        "",
        "<!-- Generated from src/dpone/error_codes.py by scripts/errors_md.py: edit the",
        "registry, then run the script. tests/unit/test_error_codes.py compares. -->",
        "",
        "Every error dpone raises on purpose is a `DponeError` with a stable `code`: it is",
        "printed as `[code] message`, and `--json` output carries it as `code` beside the",
        "`message` and the `details` that say where (file, record, column, query id).",
        "A code names the kind of problem; the message names the instance. Codes marked",
        "*(the default)* are a class's own, used where the raiser gives none.",
        "",
        "| code | meaning |",
        "|---|---|",
    ]
    lines += [f"| `{code}` | {text} |" for code, text in ERROR_CODES.items()]
    return "\n".join(lines) + "\n"
