"""Domain errors: each has a stable code and an HTTP status, raised by services and mapped to
each API family's shape in one place (`hordeops.api` for the horde routes). Written in two
parts by subject (`base`: the machinery and the flow of requests and generations; `access`: who
may do what), read as one: `errors.NotFound`, `errors.TimeoutIP`."""

from hordeops.errors.access import *  # noqa: F403
from hordeops.errors.base import *  # noqa: F403
