import os
import time

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hordeops.settings")

django_application = get_asgi_application()


async def application(scope, receive, send):
    """Django, with the monotonic arrival time stamped before the body is read.

    Generation deadlines (seed 003) count body reads and everything after them.
    """
    if scope["type"] == "http":
        scope = {**scope, "hordeops.arrived": time.monotonic()}
    await django_application(scope, receive, send)
