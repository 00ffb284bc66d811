// The Evaluation pages' only script: the full-run checklist lock and the live job status poll.
(() => {
  "use strict";
  const form = document.getElementById("start");
  if (form) {
    const button = document.getElementById("start-button");
    const hint = document.getElementById("start-hint");
    const boxes = Array.from(form.querySelectorAll('input[name="checklist"]'));
    const update = () => {
      const full = document.getElementById("mode-full").checked;
      const missing = boxes.filter((b) => !b.checked).length;
      button.disabled = full && missing > 0;
      hint.textContent = full && missing > 0
        ? `Full run: confirm ${missing} more checklist item${missing === 1 ? "" : "s"} to unlock the start button.` : "";
    };
    form.addEventListener("change", update);
    update();
  }
  const live = document.getElementById("live");
  if (live) {
    const url = live.dataset.pollUrl;
    const every = Number(live.dataset.pollMs) || 1500;
    const active = () => { const s = live.querySelector("[data-active]"); return s && s.dataset.active === "true"; };
    const poll = async () => {
      try {
        const response = await fetch(url, {cache: "no-store", credentials: "same-origin"});
        live.innerHTML = await response.text();
      } catch (e) { /* the service could not be reached: try again at the next tick */ }
      if (active()) setTimeout(poll, every);
    };
    if (active()) setTimeout(poll, every);
  }
})();
