"""A generation's kudos settlement (`kudos.earning`), from the rows the services load."""

from datetime import datetime

from jobs.models import Generation
from kudos.earning import Earner, Settlement, settle_generation


def settle(
    generation: Generation, *, tokens: int, result: str, now: datetime, charged: bool = True
) -> Settlement:
    """The kudos event of `generation` delivering `tokens`, its worker's account and its request
    loaded (as `posted_generation` loads them); its requester pays only if `charged`."""
    worker, text_request = generation.worker, generation.request
    return settle_generation(
        generation_id=generation.pk,
        model=generation.model,
        tokens=tokens,
        prompt_tokens=text_request.prompt_tokens,
        max_length=text_request.max_length,
        earner=Earner(
            account_id=worker.account_id,
            trusted=worker.account.trusted,
            anonymous=worker.account.is_anonymous,
            bridge_agent=worker.bridge_agent,
        ),
        payer_id=text_request.account_id,
        result=result,
        now=now,
        charged=charged,
    )
