"""The admin site's pages, one module per subject; each model registered once, here."""

from front.admin import accounts, ledger, requests, shared_keys, workers

__all__ = ["accounts", "ledger", "requests", "shared_keys", "workers"]
