"""The one wall clock that lease logic reads; tests move it with time-machine."""

from datetime import datetime

from django.utils import timezone


def now() -> datetime:
    return timezone.now()
