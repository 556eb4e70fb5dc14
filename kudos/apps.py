from django.apps import AppConfig
from django.db.models.signals import post_delete, post_migrate, post_save


def create_system_wallets(sender, using: str = "default", **kwargs) -> None:
    """The system wallets every event may post to, made after every migrate and flush (as
    Django's content types are), so that the statement that posts always finds them."""
    from kudos.models import Wallet

    for system in Wallet.System:
        Wallet.objects.using(using).get_or_create(system=system)


class KudosConfig(AppConfig):
    name = "kudos"
    verbose_name = "Kudos"

    def ready(self) -> None:
        from kudos import sizes

        post_migrate.connect(create_system_wallets, sender=self)
        for signal in (post_save, post_delete):
            signal.connect(sizes.forget, sender="kudos.TextModel")
