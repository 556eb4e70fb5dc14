"""A cancelled generation's settlement information, read-only in the admin, with no text."""

from jobs.models import Generation
from jobs.services import cancel_request
from tests.conftest import progress


def test_a_cancelled_generation_keeps_settlement_information_and_no_text(requester, owner, chat_job):
    job = chat_job(owner)
    progress(owner, job["id"], 1, "secret reply words", tokens=7)
    generation = Generation.objects.get(pk=job["id"])
    cancel_request(request_id=generation.request_id, reason="generation_deadline_exceeded")
    generation.refresh_from_db()
    assert generation.state == Generation.State.CANCELLED
    assert generation.settlement_information == {
        "usage": "unknown",
        "tokens_relayed": 7,
        "reservation": None,
        "reason": "generation_deadline_exceeded",
    }
    assert generation.text is None


def test_the_admin_shows_settlement_information_read_only_and_no_text(
    admin_client, requester, owner, chat_job
):
    job = chat_job(owner)
    progress(owner, job["id"], 1, "secret reply words", tokens=3)
    generation = Generation.objects.get(pk=job["id"])
    cancel_request(request_id=generation.request_id)
    page = admin_client.get(f"/admin/jobs/generation/{generation.pk}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    # In words, not raw JSON; the tokens it reported though it never submitted.
    assert "reason: cancelled; usage: unknown (no final count); tokens relayed: 3; reservation: none" in html
    assert "3 relayed, not confirmed" in html
    assert "tokens_relayed" not in html and "Job ttl" not in html
    assert 'name="settlement_information"' not in html  # shown, not editable
    assert "secret reply words" not in html
    assert "Tell me a long story" not in html
