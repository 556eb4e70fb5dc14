"""The client chat protocols, a module each over a shared base (`jobs.protocols.base`)."""

from jobs.protocols.anthropic_messages import AnthropicMessages
from jobs.protocols.base import (
    MAX_REPLY_TOKENS,
    ChatCall,
    ChatProtocol,
    Choice,
    Reply,
    Usage,
    sse,
)
from jobs.protocols.openai_chat import OpenAIChat
from jobs.protocols.openai_completions import OpenAICompletions
from jobs.protocols.openai_responses import OpenAIResponses

PROTOCOLS: dict[str, ChatProtocol] = {
    p.path: p() for p in (OpenAIChat, OpenAIResponses, AnthropicMessages, OpenAICompletions)
}


def protocol_for_path(path: str) -> ChatProtocol:
    """The protocol whose shape answers `path`: its own route, or a path under it (Anthropic's
    `/v1/messages/batches`, OpenAI's `/v1/responses/{id}`); OpenAI's chat for any other /v1 path."""
    for prefix, protocol in PROTOCOLS.items():
        if path == prefix or path.startswith(prefix + "/"):
            return protocol
    return PROTOCOLS[OpenAIChat.path]


__all__ = [
    "MAX_REPLY_TOKENS",
    "PROTOCOLS",
    "AnthropicMessages",
    "ChatCall",
    "ChatProtocol",
    "Choice",
    "OpenAIChat",
    "OpenAICompletions",
    "OpenAIResponses",
    "Reply",
    "Usage",
    "protocol_for_path",
    "sse",
]
