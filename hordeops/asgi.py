import os
import time

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hordeops.settings")

# The admin's few assets (CSS, its scripts, the lease countdown) are served by Django's own
# static handler under /static/, so that the stack needs nothing in front of it; a public
# deployment puts `collectstatic` output behind its reverse proxy instead. The API and chat
# routes never pass through it.
django_application = ASGIStaticFilesHandler(get_asgi_application())


async def application(scope, receive, send):
    """Django, with the monotonic arrival time stamped before the body is read.

    Generation deadlines (seed 003) count body reads and everything after them.
    """
    if scope["type"] == "http":
        scope = {**scope, "hordeops.arrived": time.monotonic()}
    await django_application(scope, receive, send)
