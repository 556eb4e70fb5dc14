"""The worker limits under concurrent first pops: each new name is counted after the ones
before it, so a burst of new names never runs more workers than the limits allow."""

import pytest
from rest_framework.test import APIClient

from tests.conftest import race
from workers.models import Worker

ROUNDS = 6
RACERS = 8


def _pop(api_key: str, name: str, address: str):
    # A client per thread: APIClient is not safe to share between threads.
    client = APIClient(REMOTE_ADDR=address)
    return lambda: client.post(
        "/api/v2/generate/text/pop", {"name": name, "models": ["m1"]}, format="json", HTTP_APIKEY=api_key
    )


def _outcomes(answers) -> list:
    return sorted((answer.status_code, answer.json().get("rc")) for answer in answers)


@pytest.mark.django_db(transaction=True)
def test_concurrent_first_pops_of_one_untrusted_account_run_no_more_than_three_workers(make_caller):
    for round_ in range(ROUNDS):
        owner = make_caller()
        answers = race(
            *(_pop(owner.api_key, f"r{round_}-w{n}", f"198.51.100.{round_}") for n in range(RACERS))
        )
        assert _outcomes(answers) == [(200, None)] * 3 + [(403, "TooManyWorkers")] * (RACERS - 3)
        assert Worker.objects.live().filter(account=owner.account).count() == 3


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("subnet", ["203.0.113.{}", "2001:db8:5:{}::{}"])
def test_concurrent_first_pops_from_one_address_run_no_more_than_three_untrusted_workers(make_caller, subnet):
    for round_ in range(ROUNDS):
        # Each racer its own account; the IPv6 ones each from another address of one /64.
        calls = [
            _pop(make_caller().api_key, f"a{round_}-w{n}", subnet.format(round_, n + 1))
            for n in range(RACERS)
        ]
        answers = race(*calls)
        assert _outcomes(answers) == [(200, None)] * 3 + [(403, "TooManySameIPs")] * (RACERS - 3)
