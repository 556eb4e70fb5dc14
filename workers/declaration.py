"""What a worker declares in its pop: one value from the validated body to the check-in."""

from dataclasses import dataclass

# What a worker may declare its model server supports, each a pop field, a worker column and
# (with `needs_`) a request column: a request that needs one goes only to workers declaring it.
CAPABILITIES = ("tools", "structured_outputs")


@dataclass(frozen=True)
class WorkerDeclaration:
    """A pop's body as validated (`jobs.serializers.PopInput`, the AI Horde's names): built
    once, then handed down whole to the pop and the check-in (`workers.checkin`). The check-in
    writes all but `amount` and `wait_seconds` on the worker's row (`sql.DECLARED`): they are
    this pop's, how many jobs it asks for and how long it may wait. No defaults: the body's
    are PopInput's."""

    name: str
    models: list[str]
    max_length: int
    max_context_length: int
    threads: int
    nsfw: bool
    chat: bool
    bridge_agent: str
    # What its model server can do beyond plain chat (`CAPABILITIES`): tool calls, output
    # constrained to a JSON schema. A worker that declares nothing is never offered such a job.
    tools: bool
    structured_outputs: bool
    amount: int
    wait_seconds: float  # how long the pop may wait for a job (jobs.waits); 0: not at all
