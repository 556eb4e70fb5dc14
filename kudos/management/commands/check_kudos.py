from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from kudos import sql
from kudos.models import Event, Posting, Wallet


class Command(BaseCommand):
    help = (
        "Check that the kudos ledger sums to zero and that every kept balance and kudos_details "
        "matches its postings."
    )

    def handle(self, *args, **options) -> None:
        total = Posting.objects.total()
        unbalanced = list(Event.objects.unbalanced().values_list("key", "total")[:20])
        drifted = list(Wallet.objects.drifted().values_list("account_id", "balance", "posted")[:20])
        with connection.cursor() as cursor:
            cursor.execute(sql.drifted_details() + " LIMIT 20")
            details = cursor.fetchall()
        for account_id, kept, posted in details:
            self.stderr.write(f"account {account_id}: kudos_details {kept}, postings sum to {posted}")
        for key, event_total in unbalanced:
            self.stderr.write(f"event {key} sums to {event_total}")
        for account_id, kept, posted in drifted:
            self.stderr.write(f"account {account_id}: balance {kept}, postings sum to {posted}")
        if total != 0 or unbalanced or drifted or details:
            raise CommandError(f"the kudos ledger does not reconcile (it sums to {total})")
        self.stdout.write(f"the kudos ledger balances: {Posting.objects.count()} postings, sum {total}")
