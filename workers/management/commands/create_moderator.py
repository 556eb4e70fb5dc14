import getpass
import os
import sys

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import IntegrityError

from workers.services import create_moderator

PASSWORD_VARIABLE = "MODERATOR_PASSWORD"


class Command(BaseCommand):
    help = (
        "Create a moderator: a staff user of the admin in the Moderators group. The password is "
        f"taken from {PASSWORD_VARIABLE}, or asked for twice when there is a terminal."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("name")

    def handle(self, *args, name: str, **options) -> None:
        password = os.environ.get(PASSWORD_VARIABLE) or self._prompted()
        try:
            user = create_moderator(name=name, password=password)
        except ValidationError as refused:
            raise CommandError("The password is refused: " + " ".join(refused.messages)) from None
        except IntegrityError:
            raise CommandError(f"A user named {name!r} already exists.") from None
        self.stdout.write(f"Created moderator {user.username}: log in at /admin/.")

    def _prompted(self) -> str:
        if not sys.stdin.isatty():
            raise CommandError(f"Set {PASSWORD_VARIABLE}, or run the command in a terminal to type it.")
        password = getpass.getpass("Password: ")
        if password != getpass.getpass("Password (again): "):
            raise CommandError("The two passwords differ.")
        return password
