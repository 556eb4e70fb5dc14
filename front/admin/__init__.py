"""The admin site's pages, one module per subject; each model registered once, here."""

from front.admin import accounts, documents, ledger, requests, shared_keys, styles, teams, workers

__all__ = ["accounts", "documents", "ledger", "requests", "shared_keys", "styles", "teams", "workers"]
