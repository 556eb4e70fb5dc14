"""Where a request carries its API key, read the same way by the routes and the rate limits."""

# The key everyone may use without an account of their own (the AI Horde's anonymous key).
ANONYMOUS_API_KEY = "0000000000"


def chat_api_key(headers) -> str | None:
    """The key of a /v1 request: `Authorization: Bearer <key>`, or Anthropic's `x-api-key`."""
    authorization = headers.get("authorization", "")
    if authorization[:7].lower() == "bearer ":
        return authorization[7:].strip()
    return headers.get("x-api-key")


def requester_api_key(path: str, headers) -> str:
    """The key the route at `path` authenticates with: the chat routes' own, else `apikey`."""
    if path.startswith("/v1/"):
        return chat_api_key(headers) or ""
    return headers.get("apikey") or ""
