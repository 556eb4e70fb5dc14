"""What a worker claims is bounded by what the server saw.

A worker reports its own running token count with its progress posts, and its speed is
measured from its submits. Both feed what others read and trust: the requester's `usage`, the
reward, `/stats`, and the speed gate, which ranks workers by their capacity. So:

- a token count is at most the job's `max_length` and at most the UTF-8 bytes of output the
  server relayed or was submitted (no tokenizer yields a token that decodes to nothing, but
  for special tokens, which a reply does not carry);
- a speed sample is at most TEXT_WORKER_MAX_TOKENS_PER_SECOND, however soon after its pop a
  job is submitted.
"""

from django.conf import settings


def tokens(reported: int, *, max_length: int, output_bytes: int) -> int:
    """A worker's reported token count, bounded by the job's length and the output it delivered."""
    return max(0, min(reported, max_length, output_bytes))


def speed_sample(*, tokens: int, seconds: float) -> float:
    """Tokens per second for one completed job, at most the plausible ceiling (a job handed in
    at once after its pop is counted as taking a millisecond)."""
    return min(tokens / max(seconds, 0.001), float(settings.TEXT_WORKER_MAX_TOKENS_PER_SECOND))
