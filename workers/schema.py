"""What drf-spectacular cannot say of the workers app's routes by itself."""

# DELETE /api/v2/operations/ipaddr takes a JSON body, as the AI Horde's does; drf-spectacular
# describes bodies of PUT, PATCH and POST only.
DELETE_BODIES = {
    ("/api/v2/operations/ipaddr", "delete"): {
        "type": "object",
        "properties": {"ipaddr": {"type": "string", "minLength": 7, "maxLength": 40}},
        "required": ["ipaddr"],
    },
}


def add_delete_bodies(result: dict, generator, request, public) -> dict:
    """drf-spectacular postprocessing hook: the DELETE routes' bodies."""
    for (path, method), schema in DELETE_BODIES.items():
        operation = result.get("paths", {}).get(path, {}).get(method)
        if operation is not None:
            operation["requestBody"] = {"content": {"application/json": {"schema": schema}}, "required": True}
    return result
