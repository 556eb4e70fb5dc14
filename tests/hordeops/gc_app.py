"""hordeops' ASGI app, plus `GET /gc`: the garbage collector's state in the process serving it.

Only for tests/hordeops/test_web_worker_gc.py, which runs it under gunicorn with bin/web's
worker class: what a web process's collector is set to cannot be seen from outside it.
"""

import gc
import json

from hordeops.asgi import application as horde_application


async def application(scope, receive, send):
    if scope["type"] == "http" and scope["path"] == "/gc":
        body = json.dumps({"threshold": gc.get_threshold(), "frozen": gc.get_freeze_count()}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})
        return
    await horde_application(scope, receive, send)
