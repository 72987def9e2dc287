"""A real ClickHouse port whose requests carry settings a user's profile could set.

Wraps a real transport (never a double): each request goes to the server as it would,
with the profile's settings added, so a test can show that what dpone pins holds
whatever the profile of the user it signs in as.
"""

from __future__ import annotations

import dataclasses

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.ports.clickhouse_request import ClickHouseRequest
from dpone.ports.clickhouse_result import QueryResult


class ProfileSettings:
    """The ``inner`` port, each request carrying ``settings`` as a profile would."""

    name = "http"

    def __init__(self, inner: HttpTransport, **settings: str) -> None:
        self.inner, self.settings = inner, tuple(settings.items())

    def execute(self, request: ClickHouseRequest, *, deadline: float) -> QueryResult:
        changed = dataclasses.replace(request, settings=(*request.settings, *self.settings))
        return self.inner.execute(changed, deadline=deadline)
