// The sign-up page's proof of work (front/proof_of_work.py): find the number n whose
// SHA-256(salt + n) is the challenge, with the browser's own SHA-256, and hand the solution in
// as ALTCHA's payload (base64 of its JSON). The submit button waits for it.
(function () {
  "use strict";
  const form = document.querySelector("form[data-proof-of-work]");
  const source = document.getElementById("altcha-challenge");
  if (!form || !source) return;
  const challenge = JSON.parse(source.textContent);
  const field = form.querySelector("input[name=altcha]");
  const submit = form.querySelector("button[type=submit]");
  const status = document.getElementById("proof-of-work-status");
  const BATCH = 1000; // digests in flight at once: one await per batch, not per number

  function bytes(hex) {
    const out = new Uint8Array(hex.length / 2);
    for (let i = 0; i < out.length; i++) out[i] = parseInt(hex.substr(i * 2, 2), 16);
    return out;
  }

  function equal(digest, target) {
    const got = new Uint8Array(digest);
    for (let i = 0; i < target.length; i++) if (got[i] !== target[i]) return false;
    return true;
  }

  async function solve() {
    const target = bytes(challenge.challenge);
    const encoder = new TextEncoder();
    for (let start = 0; start <= challenge.maxNumber; start += BATCH) {
      const end = Math.min(start + BATCH, challenge.maxNumber + 1);
      const pending = [];
      for (let n = start; n < end; n++) {
        pending.push(crypto.subtle.digest("SHA-256", encoder.encode(challenge.salt + n)));
      }
      const digests = await Promise.all(pending);
      for (let i = 0; i < digests.length; i++) if (equal(digests[i], target)) return start + i;
    }
    return null;
  }

  if (!window.crypto || !crypto.subtle) {
    status.textContent = "This page needs a secure connection (HTTPS) to solve its puzzle.";
    return;
  }
  const started = performance.now();
  solve().then(function (number) {
    if (number === null) {
      status.textContent = "The puzzle could not be solved: reload the page to get another.";
      return;
    }
    field.value = btoa(JSON.stringify({
      algorithm: challenge.algorithm,
      challenge: challenge.challenge,
      number: number,
      salt: challenge.salt,
      signature: challenge.signature,
    }));
    submit.disabled = false;
    form.dataset.solved = "true";
    status.textContent = "Puzzle solved in " + ((performance.now() - started) / 1000).toFixed(1) + " s: you may submit.";
  });
})();
