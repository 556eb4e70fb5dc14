from django.core.management.base import BaseCommand, CommandError

from workers.models import Account
from workers.services import create_account


class Command(BaseCommand):
    help = "Create a requester/worker account and print its new API key on the last line."

    def add_arguments(self, parser) -> None:
        parser.add_argument("name")
        parser.add_argument("--trusted", action="store_true", help="Trust the account's workers.")

    def handle(self, *args, name: str, trusted: bool, **options) -> None:
        # Names need not be unique (an account is `name#id`), but an operator names the accounts
        # they make by hand by their names alone.
        if Account.objects.filter(name=name).exists():
            raise CommandError(f"An account named {name!r} already exists.")
        account, api_key = create_account(name=name, trusted=trusted)
        trust = "trusted" if account.trusted else "untrusted"
        self.stdout.write(f"Created {trust} account {account.name}. Its API key, shown once:")
        self.stdout.write(api_key)
