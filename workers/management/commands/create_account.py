from django.core.management.base import BaseCommand, CommandError
from django.db import IntegrityError

from workers.services import create_account


class Command(BaseCommand):
    help = "Create a requester/worker account and print its new API key on the last line."

    def add_arguments(self, parser) -> None:
        parser.add_argument("name")
        parser.add_argument("--trusted", action="store_true", help="Trust the account's workers.")

    def handle(self, *args, name: str, trusted: bool, **options) -> None:
        try:
            account, api_key = create_account(name=name, trusted=trusted)
        except IntegrityError:
            raise CommandError(f"An account named {name!r} already exists.") from None
        trust = "trusted" if account.trusted else "untrusted"
        self.stdout.write(f"Created {trust} account {account.name}. Its API key, shown once:")
        self.stdout.write(api_key)
