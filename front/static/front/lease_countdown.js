// Counts each live lease's "seconds left" down once a second from the figure the server
// rendered, measured on the page's own monotonic clock. At 0 the lease has lapsed: the stale
// pass aborts it on its next run, which a reload shows.
"use strict";
(function () {
  const loaded = performance.now();
  function tick() {
    const elapsed = Math.floor((performance.now() - loaded) / 1000);
    for (const cell of document.querySelectorAll(".lease-seconds-left")) {
      const left = Math.max(0, Number(cell.dataset.secondsLeft) - elapsed);
      cell.textContent = String(left);
      cell.classList.toggle("lease-lapsed", left === 0);
    }
  }
  document.addEventListener("DOMContentLoaded", function () {
    tick();
    setInterval(tick, 1000);
  });
})();
