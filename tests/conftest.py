"""Suite-wide settings and the plugins that hold the shared helpers.

Shared fixtures and helpers live in ``tests/plugins/``; every module there is listed in
``pytest_plugins`` below, so a test names a shared fixture as a parameter and imports a
shared function from its plugin module, never from another test module or from here.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
from hypothesis import settings

from tests import chhttp
from tests.postgres_cluster import PostgresCluster, postgres_cluster

# Property tests draw the same examples on every run, so a green suite stays green on
# the same code (a run that loses a submission must not depend on luck). To search
# afresh, run with DPONE_HYPOTHESIS=explore (random examples each run).
settings.register_profile("reproducible", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("DPONE_HYPOTHESIS", "reproducible"))

# The suite interrupts real dpone processes with SIGINT. A shell that starts it in the
# background without job control (``cmd &`` in a script) hands it SIGINT ignored, and
# an ignored signal is inherited across exec: every child would ignore the tests'
# SIGINT too. A handler is not inherited (exec resets it to the default), so one set
# here gives each child the default disposition again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Every module of tests/plugins (tests/unit/test_test_layout.py checks the list): pytest
# registers their fixtures once for the whole suite and rewrites their asserts.
pytest_plugins = [
    "tests.plugins.cli",
    "tests.plugins.managed_server",
    "tests.plugins.catalog_queries",  # after managed_server, which it imports
    "tests.plugins.publication_pool",
    "tests.plugins.publication_rig",
    "tests.plugins.raw_http",
    "tests.plugins.refresh",
    "tests.plugins.retained_storage",
    "tests.plugins.staging",
    "tests.plugins.transports",
    "tests.plugins.type_samples",
]


@pytest.fixture(autouse=True)
def _servers_handed_over() -> Iterator[None]:
    """After each test, its project is gone: the servers it used are handed over
    (chhttp.hand_over_servers), so the next test's store may own their pools."""
    yield
    chhttp.hand_over_servers()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresCluster]:
    """The session's throwaway PostgreSQL cluster (tests/postgres_cluster.py); its
    password file is the process's ``PGPASSFILE`` while it runs, as libpq reads it."""
    with postgres_cluster() as cluster:
        before = os.environ.get("PGPASSFILE")
        os.environ.update(cluster.env())
        try:
            yield cluster
        finally:
            if before is None:
                os.environ.pop("PGPASSFILE", None)
            else:
                os.environ["PGPASSFILE"] = before


@pytest.fixture
def postgres_store(postgres: PostgresCluster) -> str:
    """The URL of an empty PostgreSQL store (the previous test's schema dropped)."""
    import psycopg

    with psycopg.connect(postgres.url, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS dpone CASCADE")
    return postgres.url
