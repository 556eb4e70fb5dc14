"""`{% oauth_buttons then="..." %}`: a button for each provider this horde's operator turned on."""

from django import template

from front import oauth

register = template.Library()


@register.inclusion_tag("front/oauth_buttons.html", takes_context=True)
def oauth_buttons(context, *, then: str) -> dict:
    return {"request": context["request"], "ways_in": oauth.ways_in(then=then), "then": then}
