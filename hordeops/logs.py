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


class RefusedHost(logging.Filter):
    """Django logs a request for a host outside ALLOWED_HOSTS at ERROR with its whole traceback
    (`django.security.DisallowedHost`): about 2 KB a request anyone can send. It is a refusal
    (400), logged as one WARNING line naming the host, cut to 100 characters."""

    def filter(self, record: logging.LogRecord) -> bool:
        request = getattr(record, "request", None)
        host = request.META.get("HTTP_HOST", "") if request is not None else ""
        record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
        record.msg, record.args = "request for a host this horde does not serve: %r", (host[:100],)
        record.exc_info = record.exc_text = None
        return True
