"""Make the test provider's database, RSA key, person and client: `python -m tests.oidc_provider.setup
CLIENT_ID SECRET REDIRECT_URI USERNAME PASSWORD` with DJANGO_SETTINGS_MODULE and OIDC_PROVIDER_DB set."""

import sys

import django
from django.core.management import call_command


def main(client_id: str, secret: str, redirect_uri: str, username: str, password: str) -> None:
    django.setup()
    from django.contrib.auth.models import User
    from oidc_provider.models import Client, ResponseType

    call_command("migrate", verbosity=0)
    call_command("creatersakey")
    User.objects.create_user(username, email=f"{username}@example.org", password=password, first_name="Ada")
    client = Client.objects.create(
        name="hordeops",
        client_type="confidential",
        client_id=client_id,
        client_secret=secret,
        jwt_alg="RS256",
        require_consent=False,
        _redirect_uris=redirect_uri,
        _scope="openid profile email",
    )
    client.response_types.add(ResponseType.objects.get(value="code"))


if __name__ == "__main__":
    main(*sys.argv[1:])
