"""OpenAI's error encoding, shared by its two protocols (Chat Completions and Responses)."""

from typing import Any

from hordeops import errors
from jobs.protocols.base import ChatProtocol, snake


class OpenAIErrors(ChatProtocol):
    """Errors as OpenAI writes them: `{"error": {"message", "type", "param", "code"}}`."""

    CODES = {"UnknownModel": "model_not_found"}

    def error_object(self, err: errors.DomainError) -> dict[str, Any]:
        """OpenAI's error object: `{"message", "type", "param", "code"}`."""
        status = err.status
        if status >= 500:
            type_ = "timeout_error" if status == 504 else "server_error"
        elif status == 401:
            type_ = "authentication_error"
        elif status == 429:
            type_ = "rate_limit_error"
        else:
            type_ = "invalid_request_error"
        code = getattr(err, "openai_code", None) or self.CODES.get(err.code) or snake(err.code)
        return {"message": err.message, "type": type_, "param": getattr(err, "param", None), "code": code}

    def error_body(self, err: errors.DomainError) -> dict[str, Any]:
        return {"error": self.error_object(err)}
