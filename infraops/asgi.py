"""One ASGI application for HTTP and websockets."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "infraops.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402 (needs Django set up first)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from agents.routing import websocket_urlpatterns as agent_sockets  # noqa: E402
from infraops.routing import websocket_urlpatterns as core_sockets  # noqa: E402
from reviews.routing import websocket_urlpatterns as review_sockets  # noqa: E402

# The project's composition root: it alone wires every app's sockets together.

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(core_sockets + agent_sockets + review_sockets))
        ),
    }
)
