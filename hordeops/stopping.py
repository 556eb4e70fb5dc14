"""What a web process does first when it is told to stop, before it waits for its connections.

The base knows no app: an app registers its hook when it is ready (`on_stop`), and the web
worker (`hordeops.web_worker`) runs them all on its event loop as its shutdown begins.
"""

from collections.abc import Awaitable, Callable

_hooks: list[Callable[[], Awaitable[None]]] = []


def on_stop(hook: Callable[[], Awaitable[None]]) -> None:
    """Run `hook` (a coroutine function) when this web process starts to stop."""
    if hook not in _hooks:
        _hooks.append(hook)


async def run_stop_hooks() -> None:
    for hook in _hooks:
        await hook()
