"""`jobs.follower`: what a requester's follower makes of its request's relay stream."""

import asyncio
import uuid

from jobs import relay
from jobs.follower import Follower
from tests.jobs.test_relay import WAIT_SECONDS, _settle


def test_a_delta_whose_post_committed_the_stream_is_given_out_with_no_step_of_the_followers_own():
    # No request in the database and no database access: a follower that committed the stream
    # itself would find nothing to commit and hold the delta back.
    request_id, generation_id = uuid.uuid4(), str(uuid.uuid4())
    relay.publish(request_id, "delta", generation_id, text="  ", seq=1)  # held: white space alone
    relay.publish(request_id, "delta", generation_id, text="Once", seq=2, model="chat-model")
    relay.publish(request_id, "delta", generation_id, text=" upon", seq=3)

    async def follow() -> list[tuple[str, int, str]]:
        follower = Follower(request_id, stream=True)
        outputs = [await asyncio.wait_for(follower.next_output(), WAIT_SECONDS) for _ in range(2)]
        await follower.close()
        await _settle()
        return [(output.text, output.index, output.model) for output in outputs]

    assert asyncio.run(follow()) == [("  Once", 0, "chat-model"), (" upon", 0, "")]
