"""A server's protocol as the client speaks it (a backend's `dialect`): the path of each route, the body of one
request, how a response is read into an Outcome, and whether the server keeps connections between requests.

The client drives any dialect the same way (harness.client.drive); each backend (harness/backends/) names its own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from harness.client.config import ClientConfig, SamplingConfig
from harness.client.requests import Outcome, RequestPlan
from harness.client.streams import Parser

# (response, streamed, incremental /generate stream, the outcome to fill, the stream parser)
Reader = Callable[[aiohttp.ClientResponse, bool, bool, Outcome, Parser | None], Awaitable[None]]
# (route, sampling, client config, the request, the served model's name) -> the JSON body
Payload = Callable[[str, SamplingConfig, ClientConfig, RequestPlan, str], dict[str, Any]]


@dataclass(frozen=True)
class Route:
    path: str
    read: Reader


@dataclass(frozen=True)
class Dialect:
    """How the client talks to one kind of server."""

    name: str
    routes: dict[str, Route]  # client.route -> its path and reader
    payload: Payload
    force_close: bool = False  # one connection per request (a server that closes its end after each response)

    def route(self, name: str) -> Route:
        return self.routes[name]
