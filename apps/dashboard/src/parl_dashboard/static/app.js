// PARL dashboard: live updates for the page, over the WebSocket at /live.
// The server renders (and escapes) every fragment; this only puts them in place:
// {"replace": {id: html}} swaps an element's content, {"append": {id: html}} adds to it
// (a log), and {"offset": n} records the last log line received, so that a reconnection
// continues where it stopped. While a pointer is down the swaps wait (the latest of each is
// kept) and are made once it is up and its click has been handled: a table swapped between a
// press and its release would lose the click on the link pressed (a live table changes every
// second). No framework, no build step.
"use strict";

(() => {
  const MAX_LOG_LINES = 20000;

  document.documentElement.classList.add("js");
  for (const select of document.querySelectorAll("form.filters select")) {
    select.addEventListener("change", () => select.form.submit());
  }

  const query = new URLSearchParams(document.body.dataset.live || "");
  if (!query.has("view")) return;
  const status = document.getElementById("live-status");
  let retry = 500;

  function setStatus(text, state) {
    if (!status) return;
    status.textContent = text;
    status.dataset.state = state;
  }

  function nearBottom() {
    const root = document.scrollingElement;
    return root.scrollHeight - root.scrollTop - root.clientHeight < 40;
  }

  let held = null; // the swaps waiting for a pointer to be up: id -> html

  function replace(fragments) {
    for (const [id, html] of Object.entries(fragments)) {
      const element = document.getElementById(id);
      if (element) element.innerHTML = html;
    }
  }

  function release() {
    if (held === null) return;
    const fragments = held;
    held = null;
    replace(fragments);
  }

  document.addEventListener("pointerdown", () => { held = held || {}; }, true);
  // After the click that follows the release: the task that dispatches it ends first.
  document.addEventListener("pointerup", () => window.setTimeout(release, 0), true);
  document.addEventListener("pointercancel", release, true);

  function apply(message) {
    if (held !== null) Object.assign(held, message.replace || {});
    else replace(message.replace || {});
    for (const [id, html] of Object.entries(message.append || {})) {
      const element = document.getElementById(id);
      if (!element) continue;
      const follow = nearBottom();
      element.insertAdjacentHTML("beforeend", html);
      while (element.childElementCount > MAX_LOG_LINES) element.firstElementChild.remove();
      if (follow) window.scrollTo(0, document.scrollingElement.scrollHeight);
    }
    if (message.offset !== undefined) query.set("offset", String(message.offset));
  }

  function connect() {
    const url = new URL("/live?" + query.toString(), window.location.href);
    url.protocol = window.location.protocol === "https:" ? "wss:" : "ws:";
    const socket = new WebSocket(url);
    socket.addEventListener("open", () => {
      retry = 500;
      setStatus("live", "live");
    });
    socket.addEventListener("message", (event) => apply(JSON.parse(event.data)));
    socket.addEventListener("close", () => {
      setStatus("reconnecting", "down");
      window.setTimeout(connect, retry);
      retry = Math.min(retry * 2, 10000);
    });
  }

  connect();
})();
