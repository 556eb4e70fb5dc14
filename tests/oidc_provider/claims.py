"""What the test provider says of a person: their name and email, as a real provider would."""


def userinfo(claims, user):
    claims["name"] = user.get_full_name() or user.username
    claims["preferred_username"] = user.username
    claims["email"] = user.email
    claims["email_verified"] = True
    return claims
