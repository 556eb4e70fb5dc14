"""A real inference engine for the bridge's tests and bench: llama.cpp's Python server
(llama-cpp-python, installed in .venv-engine by bin/engine-venv), serving a tiny llama model
with random weights that `write_model` makes. The engine's own tokenizer, chat template,
sampling, stop handling and streaming are what the bridge meets; only the weights are made up.

The model's vocabulary is llama's byte fallback: `<unk>`, `<s>`, `</s>` and the 256 bytes.
Only the printable ASCII bytes get output weights, scaled so that the logits spread wide: the
reply is ASCII text, and the special tokens (end of text included) score 0 against peaks far
above, so a reply runs to its `max_tokens` instead of ending at a random `</s>`.
"""

import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.live import ROOT, free_port

ENGINE_PYTHON = ROOT / ".venv-engine" / "bin" / "python"
LOG_TAIL_LINES = 40
# What the engine inherits: llama-cpp-python's server reads its settings from the environment
# too (PORT and HOST over its --port and --host), so the user's own are not passed on.
ENGINE_ENVIRONMENT = ("PATH", "HOME", "LANG", "TMPDIR", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def engine_environment() -> dict[str, str]:
    """A clean environment for the engine: only what a process needs to run."""
    kept = {name: os.environ[name] for name in ENGINE_ENVIRONMENT if name in os.environ}
    return {**kept, "PYTHONUNBUFFERED": "1"}


STARTUP_TIMEOUT_SECONDS = 60
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Written by the engine's Python (numpy and gguf live there), so that .venv needs neither.
WRITER = r"""
import sys
import numpy as np
import gguf

path, n_embd, n_blocks, n_ff, n_ctx, seed = sys.argv[1], *map(int, sys.argv[2:7])
template = sys.stdin.read()
rng = np.random.default_rng(seed)
heads = 4
tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
writer = gguf.GGUFWriter(path, "llama")
writer.add_name("hordeops-tiny")
writer.add_context_length(n_ctx)
writer.add_embedding_length(n_embd)
writer.add_block_count(n_blocks)
writer.add_feed_forward_length(n_ff)
writer.add_head_count(heads)
writer.add_head_count_kv(heads)
writer.add_layer_norm_rms_eps(1e-5)
writer.add_rope_dimension_count(n_embd // heads)
writer.add_file_type(0)
writer.add_tokenizer_model("llama")
writer.add_token_list(tokens)
writer.add_token_scores([0.0] * len(tokens))
writer.add_token_types([2, 3, 3] + [6] * 256)
writer.add_bos_token_id(1)
writer.add_eos_token_id(2)
writer.add_unk_token_id(0)
writer.add_add_bos_token(True)
writer.add_chat_template(template)

def weights(rows, cols, scale=None):
    scale = scale if scale is not None else 1 / np.sqrt(cols)
    return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

writer.add_tensor("token_embd.weight", weights(len(tokens), n_embd, 1.0))
writer.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
output = np.zeros((len(tokens), n_embd), dtype=np.float32)
printable = [3 + b for b in range(32, 127)] + [3 + 10]
output[printable] = weights(len(printable), n_embd, 4.0)
writer.add_tensor("output.weight", output)
for block in range(n_blocks):
    for name, shape in [
        ("attn_q", (n_embd, n_embd)), ("attn_k", (n_embd, n_embd)), ("attn_v", (n_embd, n_embd)),
        ("attn_output", (n_embd, n_embd)), ("ffn_gate", (n_ff, n_embd)), ("ffn_up", (n_ff, n_embd)),
        ("ffn_down", (n_embd, n_ff)),
    ]:
        writer.add_tensor(f"blk.{block}.{name}.weight", weights(*shape))
    writer.add_tensor(f"blk.{block}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
    writer.add_tensor(f"blk.{block}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
writer.write_header_to_file()
writer.write_kv_data_to_file()
writer.write_tensors_to_file()
writer.close()
"""


def write_model(
    path: Path,
    *,
    embedding: int = 64,
    blocks: int = 2,
    feed_forward: int = 128,
    context: int = 2048,
    seed: int = 7,
) -> Path:
    """A llama GGUF file with random weights at `path`: tiny by default, slower as it grows."""
    subprocess.run(
        [str(ENGINE_PYTHON), "-c", WRITER, str(path), str(embedding), str(blocks), str(feed_forward),
         str(context), str(seed)],
        input=CHAT_TEMPLATE, text=True, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return path


@dataclass
class Engine:
    """`python -m llama_cpp.server` on a free port, its log in a temporary file."""

    model: Path
    context: int = 2048
    threads: int = 1
    # llama-cpp-python's chat handler, when not the model's own template: `chatml-function-calling`
    # answers tools (grammar-constrained arguments), so that random weights make valid calls.
    chat_format: str | None = None

    def start(self, port: int | None = None) -> "Engine":
        """Serve on `port` (a free one unless given: a restart keeps its address)."""
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(mode="w+", suffix=".log", delete=False)
        # Requests wait their turn, as in llama-server's slots; by default this server would
        # end the running one when another comes.
        self.process = subprocess.Popen(
            [str(ENGINE_PYTHON), "-m", "llama_cpp.server", "--model", str(self.model), "--host", "127.0.0.1",
             "--port", str(self.port), "--n_ctx", str(self.context), "--n_threads", str(self.threads),
             "--n_threads_batch", str(self.threads), "--interrupt_requests", "False",
             *(["--chat_format", self.chat_format] if self.chat_format else [])],
            stdout=self.log, stderr=subprocess.STDOUT, env=engine_environment(),
        )  # fmt: skip
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"the engine exited with {self.process.returncode}:\n{self.output_tail()}")
            try:
                if httpx.get(f"{self.url}/v1/models", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the engine did not answer:\n{self.output_tail()}")
            time.sleep(0.2)

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def output_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The end of the engine's log, where the reason it stopped is: the whole log of a model
        load runs to thousands of lines."""
        return "\n".join(self.output().splitlines()[-lines:])

    def disconnects(self) -> int:
        """How many streams the engine saw its client leave (its own log line)."""
        return len(re.findall(r"Disconnected from client", self.output()))

    def cpu_seconds(self) -> float:
        """The engine process's CPU time so far: it grows while it generates, and only then."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.log.close()
        os.unlink(self.log.name)
