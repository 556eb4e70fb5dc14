"""Logging filters named in settings.LOGGING."""

import logging

from hordeops import errors


class ExpectedOutcomes(logging.Filter):
    """Django logs every 5xx answer at ERROR (`django.request`, "Gateway Timeout: /path"). A
    504 is a requester's generation deadline running out: an outcome the requester asked for,
    not a fault of the horde. It is logged at INFO, with its code (no prompt text: the record
    has only the method and the path)."""

    deadline = errors.GenerationDeadlineExceeded

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "status_code", None) == self.deadline.status and record.levelno > logging.INFO:
            request = getattr(record, "request", None)
            method, path = getattr(request, "method", "?"), getattr(request, "path", "?")
            record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
            record.msg, record.args = (
                "%s %s: %s (%s)",
                (method, path, self.deadline.code, self.deadline.status),
            )
        return True
