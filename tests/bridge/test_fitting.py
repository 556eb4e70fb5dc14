"""How the bridge fits a job into the backend's context: with the engine's own token count, which
it asks only when a prompt might not fit."""

import asyncio

import httpx
import pytest

from hordeops_bridge.job import MOST_FRAME_TOKENS, MOST_TOKENS_PER_BYTE, Request, fit, surely_fits


class EngineCount:
    """The engine's own token count of a text (llama.cpp's tokenize route), and how often asked."""

    def __init__(self, url: str) -> None:
        self.url, self.asked = url, 0

    async def __call__(self, text: str) -> int:
        self.asked += 1
        answer = await asyncio.to_thread(httpx.post, f"{self.url}/extras/tokenize", json={"input": text})
        return len(answer.json()["tokens"])


@pytest.mark.parametrize(
    "text",
    ["plain words and spaces", "   ", "naïve café, 東京 and emoji 🙂", "<|im_start|>user\nhi<|im_end|>\n"],
)
def test_the_engines_tokenizer_stays_within_the_bound_the_bridge_counts_on(engine, text) -> None:
    # The tests' model knows only bytes and spells a space as three: the worst a tokenizer does.
    # Beyond the text: the start of text and the word mark put before it (within the frame).
    counted = asyncio.run(EngineCount(engine.url)(text))
    assert counted <= MOST_TOKENS_PER_BYTE * len(text.encode()) + 1 + MOST_TOKENS_PER_BYTE
    assert counted <= MOST_TOKENS_PER_BYTE * len(text.encode()) + MOST_FRAME_TOKENS


def test_a_chat_that_surely_fits_is_sent_without_asking_the_engine_to_count_it(engine) -> None:
    count = EngineCount(engine.url)
    request = Request(max_tokens=400, messages=[{"role": "user", "content": "Story 1."}])
    assert surely_fits(request, budget=2048)
    assert asyncio.run(fit(request, budget=2048, count=count)) == request
    assert count.asked == 0


def test_a_prompt_that_may_not_fit_is_counted_and_loses_its_start(engine) -> None:
    count = EngineCount(engine.url)
    prompt = "Story. " + "word " * 200 + "The end is near"
    request = Request(max_tokens=32, prompt=prompt)
    assert not surely_fits(request, budget=160)
    fitted = asyncio.run(fit(request, budget=160, count=count))
    assert count.asked > 0
    assert prompt.endswith(fitted.prompt) and len(fitted.prompt) < len(prompt)
    assert asyncio.run(EngineCount(engine.url)(fitted.prompt)) <= 160 - 32
    assert fitted.fitted.startswith("trimmed the prompt's start")


def test_tools_a_template_writes_into_the_prompt_count_against_the_bound() -> None:
    messages = [{"role": "user", "content": "hi"}]
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"description": "x" * 600}}}
    plain = Request(max_tokens=200, messages=messages)
    with_tools = Request(max_tokens=200, messages=messages, agent={"tools": [tool]})
    assert surely_fits(plain, budget=2048) and not surely_fits(with_tools, budget=2048)
