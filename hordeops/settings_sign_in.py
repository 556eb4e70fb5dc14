"""Signing in to the account page with OAuth (front/oauth.py), through django-allauth: each
provider is on when the operator gives its client id and secret, and off otherwise.

`hordeops.settings` takes every setting of this module; like it, this module reads each one
from an environment variable (through `hordeops.env`).
"""

from hordeops.env import env_str

# allauth and the providers people use to sign in to the AI Horde, and any OpenID Connect one.
SIGN_IN_APPS = [
    "allauth",
    "allauth.account",
    "allauth.socialaccount",
    "allauth.socialaccount.providers.github",
    "allauth.socialaccount.providers.discord",
    "allauth.socialaccount.providers.google",
    "allauth.socialaccount.providers.openid_connect",
]

# The OpenID Connect provider's id in its URLs (/oauth/oidc/login/ and /oauth/oidc/login/callback/,
# the redirect URI to give the provider), with no prefix of allauth's before it; its name is the button's.
OIDC_PROVIDER_ID = "oidc"
SOCIALACCOUNT_OPENID_CONNECT_URL_PREFIX = ""


def _client(prefix: str) -> dict | None:
    client_id, secret = env_str(f"{prefix}_CLIENT_ID", ""), env_str(f"{prefix}_SECRET", "")
    return {"client_id": client_id, "secret": secret} if client_id and secret else None


# What each provider is asked for: who the person is, never their email (the horde keeps none).
SCOPES = {
    "github": [],
    "discord": ["identify"],
    "google": ["profile"],
    "openid_connect": ["openid", "profile"],
}


def _providers() -> dict:
    providers = {}
    for provider in ("github", "discord", "google"):
        if (client := _client(f"OAUTH_{provider.upper()}")) is not None:
            providers[provider] = {"APPS": [client], "SCOPE": SCOPES[provider]}
    oidc, server_url = _client("OAUTH_OIDC"), env_str("OAUTH_OIDC_SERVER_URL", "")
    if oidc is not None and server_url:
        oidc |= {
            "provider_id": OIDC_PROVIDER_ID,
            "name": env_str("OAUTH_OIDC_NAME", "OpenID Connect"),
            "settings": {"server_url": server_url},
        }
        providers["openid_connect"] = {"APPS": [oidc], "SCOPE": SCOPES["openid_connect"]}
    return providers


SOCIALACCOUNT_PROVIDERS = _providers()
SOCIALACCOUNT_ADAPTER = "front.oauth.IdentityAdapter"
ACCOUNT_ADAPTER = "front.oauth.NoLocalAccounts"
# A provider's sign-in makes its Django user at once: nothing is asked, no email is sent or needed.
SOCIALACCOUNT_AUTO_SIGNUP = True
SOCIALACCOUNT_EMAIL_REQUIRED = False
SOCIALACCOUNT_QUERY_EMAIL = False
ACCOUNT_EMAIL_VERIFICATION = "none"
# Only the identity is kept (the provider's id for the person), never their tokens.
SOCIALACCOUNT_STORE_TOKENS = False
# A sign-in starts with a POST under CSRF, never a GET a page of another site could send.
SOCIALACCOUNT_LOGIN_ON_GET = False
SOCIALACCOUNT_REQUESTS_TIMEOUT = 10
