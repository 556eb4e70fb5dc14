from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from kudos import holds, sql
from kudos.models import Event, Posting, Wallet


class Command(BaseCommand):
    help = (
        "Check that the kudos ledger sums to zero, that every kept balance and kudos_details "
        "matches its postings, and that the holds agree with the requests they are for."
    )

    def handle(self, *args, **options) -> None:
        total = Posting.objects.total()
        unbalanced = list(Event.objects.unbalanced().values_list("key", "total")[:20])
        drifted = list(Wallet.objects.drifted().values_list("account_id", "balance", "posted")[:20])
        with connection.cursor() as cursor:
            cursor.execute(sql.drifted_details() + " LIMIT 20")
            details = cursor.fetchall()
        disagreeing = holds.disagreements()
        for account_id, kept, posted in details:
            self.stderr.write(f"account {account_id}: kudos_details {kept}, postings sum to {posted}")
        for key, event_total in unbalanced:
            self.stderr.write(f"event {key} sums to {event_total}")
        for account_id, kept, posted in drifted:
            self.stderr.write(f"account {account_id}: balance {kept}, postings sum to {posted}")
        for line in disagreeing:
            self.stderr.write(line)
        if total != 0 or unbalanced or drifted or details:
            raise CommandError(f"the kudos ledger does not reconcile (it sums to {total})")
        if disagreeing:
            raise CommandError(f"{len(disagreeing)} hold(s) disagree with their requests")
        self.stdout.write(f"the kudos ledger balances: {Posting.objects.count()} postings, sum {total}")
