from django.core.management.base import BaseCommand, CommandError

from hordeops import logins


class Command(BaseCommand):
    help = "Clear the failed admin logins of a user name and/or a client address, before their window ends."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--user", help="the user name the logins were tried for")
        parser.add_argument("--address", help="the client address they came from")

    def handle(self, *args, user: str | None, address: str | None, **options) -> None:
        if user is None and address is None:
            raise CommandError("Name a --user, an --address, or both.")
        cleared = logins.unlock(username=user, address=address)
        self.stdout.write(f"Cleared {cleared} lockout count{'s' if cleared != 1 else ''}.")
