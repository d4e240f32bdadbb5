// The greendot demo page: pick who you are, follow people, watch their dots,
// and see who else is in the lobby (a room) and who is typing there. It uses
// the same client every app uses (/greendot.js), and the demo-only endpoints
// under /demo/api/ to write the follow graph.
//
// Query parameters: user (who you are), device, platform (by default
// mobile on a touch screen, else web), background_on_hide (1 or 0; by
// default 1 on a touch screen: a phone's user switching to another app is
// away, not offline, for the gateway's background grace), and, to see the
// timings in seconds rather than minutes: idle_after_ms, close_after_ms,
// activity_ms, backoff_base_ms, backoff_max_ms, drain_jitter_ms,
// stable_after_ms, graph_poll_ms.

import { GreenDot, STATUSES, validUserId } from "/greendot.js";

const QUICK = ["alice", "bob", "carol", "dave"];
const LOBBY = "demo:lobby";
// The avatars' colours: each user gets one from their id.
const COLORS = ["#0969da", "#1a7f37", "#8250df", "#bf3989", "#cf222e", "#bc4c00", "#1b7c83", "#6e7781"];
const params = new URLSearchParams(location.search);
const $ = (id) => document.getElementById(id);

// number reads a non-negative number from the query string.
function number(name) {
  const v = params.get(name);
  if (v === null || v === "") return undefined;
  const n = Number(v);
  if (!Number.isFinite(n) || n < 0) {
    console.warn(`greendot demo: ignoring ${name}=${v}: not a number of milliseconds`);
    return undefined;
  }
  return n;
}

// linkAs returns this page's URL as another user, with the same settings.
function linkAs(user) {
  const p = new URLSearchParams(params);
  p.set("user", user);
  return `${location.pathname}?${p}`;
}

function el(tag, props = {}, ...children) {
  const e = document.createElement(tag);
  Object.assign(e, props);
  e.append(...children);
  return e;
}

// ago says how long ago a unix time in seconds was, in words.
export function ago(seconds, now = Date.now()) {
  const d = Math.max(0, Math.round(now / 1000 - seconds));
  if (d < 10) return "just now";
  if (d < 60) return `${d} seconds ago`;
  const m = Math.round(d / 60);
  if (m < 60) return m === 1 ? "a minute ago" : `${m} minutes ago`;
  const h = Math.round(m / 60);
  if (h < 24) return h === 1 ? "an hour ago" : `${h} hours ago`;
  return `on ${new Date(seconds * 1000).toLocaleDateString()}`;
}

// colorOf picks a user's avatar colour from their id.
export function colorOf(id) {
  let h = 0;
  for (const c of id) h = (h * 31 + c.codePointAt(0)) >>> 0;
  return COLORS[h % COLORS.length];
}

// typingText says who is typing, in words.
export function typingText(names) {
  if (names.length === 0) return "";
  if (names.length === 1) return `${names[0]} is typing…`;
  if (names.length === 2) return `${names[0]} and ${names[1]} are typing…`;
  return `${names.length} people are typing…`;
}

function pick() {
  $("pick").hidden = false;
  const quick = $("pick-quick");
  for (const u of QUICK) quick.append(el("a", { href: linkAs(u), className: "quick", textContent: u }), " ");
  const input = $("pick-input");
  input.value = params.get("user") ?? "";
  $("pick-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    if (validUserId(input.value)) location.href = linkAs(input.value);
  });
  input.focus();
}

function start(me) {
  document.title = `${me} · greendot demo`;
  $("me").hidden = false;
  $("people").hidden = false;
  $("lobby").hidden = false;
  $("me-name").textContent = me;
  $("other-tab").href = linkAs(QUICK.find((u) => u !== me));
  const switchParams = new URLSearchParams(params);
  switchParams.delete("user");
  $("switch-user").href = `${location.pathname}?${switchParams}`;

  const touch = window.matchMedia("(pointer: coarse)").matches;
  const client = new GreenDot({
    user: me,
    device: params.get("device") ?? "web",
    platform: params.get("platform") ?? (touch ? "mobile" : "web"),
    backgroundOnHide: params.has("background_on_hide") ? params.get("background_on_hide") === "1" : touch,
    idleAfterMs: number("idle_after_ms"),
    closeAfterMs: number("close_after_ms"),
    activityIntervalMs: number("activity_ms"),
    backoffBaseMs: number("backoff_base_ms"),
    backoffMaxMs: number("backoff_max_ms"),
    drainJitterMs: number("drain_jitter_ms"),
    stableAfterMs: number("stable_after_ms"),
  });
  const graph = { following: new Map(), followers: [], lastSeen: "contacts" };
  const denied = new Map(); // user id -> reason
  const states = []; // connection states seen, for the curious (and the tests)

  async function api(path, body) {
    const res = await fetch(`/demo/api/${path}?user=${encodeURIComponent(me)}`, body === undefined ? {} : {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
    const data = await res.json().catch(() => ({}));
    if (!res.ok) throw new Error(data.message || data.error || `HTTP ${res.status}`);
    return data;
  }

  // --- you ---

  const connText = {
    new: () => "Starting",
    connecting: () => "Connecting…",
    open: (d) => `Connected (connection ${d.conn_id})`,
    reconnecting: (d) => `Connection lost${d.code ? ` (code ${d.code})` : ""}; retrying in ${(d.delay / 1000).toFixed(1)} s`,
    suspended: () => "Paused while this tab is hidden; it reconnects when you come back",
    // The gateway's close code ends the client for good (kicked, a client
    // bug): this page connects again only when loaded again.
    closed: (d) => d.code ? `Closed by the server (code ${d.code}${d.reason ? `: ${d.reason}` : ""}); reload the page to connect again` : "Closed",
  };
  client.onState((state, detail) => {
    states.push({ state, ...detail });
    if (states.length > 100) states.shift();
    const s = $("conn-state");
    s.dataset.state = state;
    s.textContent = connText[state](detail);
  });

  client.onSelf((self) => {
    const dot = $("me-dot");
    dot.dataset.status = self.status === "invisible" ? "offline" : self.status;
    dot.setAttribute("aria-label", self.status);
    $("me-status-text").textContent = self.status === "invisible" ? "invisible: you look offline to others" : self.status;
    $("me-devices").textContent = self.devices === 1 ? "(1 device)" : `(${self.devices} devices)`;
    if (STATUSES.includes(self.status) && (self.status !== "away" || client.chosenStatus === "away")) {
      $("status-select").value = self.status;
    }
  });
  $("status-select").addEventListener("change", (ev) => client.setStatus(ev.target.value));

  $("privacy-select").addEventListener("change", async (ev) => {
    try {
      await api("privacy", { last_seen: ev.target.value });
    } catch (err) {
      showError(`Could not save: ${err.message}`);
    }
  });

  // --- people ---

  function showError(msg) {
    const e = $("follow-error");
    e.textContent = msg;
    e.hidden = msg === "";
  }

  function personItem(id) {
    let li = $("following").querySelector(`li[data-user="${id}"]`);
    if (li) return li;
    const unfollow = el("button", { type: "button", className: "link", textContent: "Unfollow" });
    unfollow.setAttribute("aria-label", `Unfollow ${id}`);
    unfollow.addEventListener("click", async () => {
      try {
        await api("unfollow", { user_id: id });
        client.unsubscribe([id]);
        await refresh();
      } catch (err) {
        showError(`Could not unfollow ${id}: ${err.message}`);
      }
    });
    li = el("li", {},
      el("span", { className: "dot", role: "img" }),
      el("span", { className: "grow" },
        el("strong", { className: "name", textContent: id }),
        el("span", { className: "status-text" }),
        el("span", { className: "last-seen" }),
        el("span", { className: "note" })),
      unfollow);
    li.dataset.user = id;
    $("following").append(li);
    return li;
  }

  function render(id) {
    if (!graph.following.has(id)) return;
    const li = personItem(id);
    const p = client.presence(id);
    const followsBack = graph.following.get(id);
    const status = p ? p.status : "unknown";
    const dot = li.querySelector(".dot");
    dot.dataset.status = status;
    dot.setAttribute("aria-label", status === "unknown" ? "status not shared" : status);
    li.querySelector(".status-text").textContent = p ? p.status : "";
    li.querySelector(".last-seen").textContent =
      p && p.status === "offline" && p.last_seen ? `last seen ${ago(p.last_seen)}` : "";
    let note = "";
    if (!followsBack) note = `You see ${id}'s dot once ${id} follows you back.`;
    else if (!p && denied.has(id)) note = `Not shared (${denied.get(id).replaceAll("_", " ")}); retrying.`;
    else if (!p) note = "Waiting for presence…";
    li.querySelector(".note").textContent = note;
  }

  function renderAll() {
    for (const li of [...$("following").children]) {
      if (!graph.following.has(li.dataset.user)) li.remove();
    }
    for (const id of [...graph.following.keys()].sort()) render(id);
    $("following-empty").hidden = graph.following.size > 0;

    const back = graph.followers.filter((id) => !graph.following.has(id)).sort();
    $("followers-title").hidden = back.length === 0;
    const list = $("followers");
    list.replaceChildren(...back.map((id) => {
      const btn = el("button", { type: "button", className: "link", textContent: "Follow back" });
      btn.setAttribute("aria-label", `Follow ${id} back`);
      btn.addEventListener("click", () => follow(id, false));
      const li = el("li", {}, el("span", { className: "grow" }, el("strong", { textContent: id }),
        el("span", { className: "note", textContent: `${id} follows you` })), btn);
      li.dataset.user = id;
      return li;
    }));
    $("privacy-select").value = graph.lastSeen;
  }

  // load reads the graph and watches everyone who is a mutual follower.
  async function load() {
    try {
      const g = await api("graph");
      graph.following = new Map(g.following.map((f) => [f.user_id, f.follows_you]));
      graph.followers = g.followers;
      graph.lastSeen = g.last_seen;
      const watched = new Set(client.subscriptions);
      const want = [...graph.following].filter(([, back]) => back).map(([id]) => id).filter((id) => !watched.has(id));
      const gone = [...watched].filter((id) => !graph.following.get(id));
      if (gone.length > 0) client.unsubscribe(gone);
      renderAll();
      if (want.length > 0) {
        for (const id of want) denied.delete(id);
        client.subscribe(want).then(() => renderAll(), () => {});
      }
    } catch (err) {
      console.warn("greendot demo: reading the follow graph failed:", err);
    }
  }

  // refresh runs load, or, when a load is running (it may have read the
  // graph before a change just made), runs one more after it.
  let running = null;
  let queued = null;
  function refresh() {
    if (!running) {
      running = load().finally(() => {
        running = null;
      });
      return running;
    }
    if (!queued) {
      queued = running.then(() => {
        queued = null;
        return refresh();
      });
    }
    return queued;
  }

  async function follow(id, both) {
    showError("");
    try {
      await api("follow", { user_id: id, both });
      await refresh();
    } catch (err) {
      showError(`Could not follow ${id}: ${err.message}`);
    }
  }

  $("follow-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const input = $("follow-input");
    const id = input.value.trim();
    if (!validUserId(id)) {
      showError("A user id is 1 to 64 letters, digits, _ or -.");
      return;
    }
    if (id === me) {
      showError("You always see yourself: follow someone else.");
      return;
    }
    input.value = "";
    follow(id, $("follow-both").checked);
  });

  // --- the lobby: a room everyone on this page is in ---

  const lobby = client.room(LOBBY, { name: me, color: colorOf(me) });

  // look returns how a member shows: the name and colour of their newest
  // connection's meta, as far as they are sound.
  function look(member) {
    const meta = member?.conns.at(-1)?.meta ?? {};
    const id = member?.user_id ?? "";
    const name = typeof meta.name === "string" && meta.name.trim() !== "" ? meta.name.trim().slice(0, 32) : id;
    const color = typeof meta.color === "string" && /^#[0-9a-f]{6}$/i.test(meta.color) ? meta.color : colorOf(id);
    return { name, color };
  }

  function renderLobby() {
    const members = [...lobby.members.values()].sort((a, b) =>
      (b.user_id === me) - (a.user_id === me) || a.user_id.localeCompare(b.user_id));
    $("lobby-members").replaceChildren(...members.map((m) => {
      const { name, color } = look(m);
      const label = m.user_id === me ? `${name} (you)` : name;
      const li = el("li", { className: "avatar", textContent: [...name][0].toUpperCase(), title: label });
      li.setAttribute("aria-label", label);
      li.style.backgroundColor = color;
      li.dataset.user = m.user_id;
      if (m.user_id === me) li.dataset.me = "";
      return li;
    }));
    // Until the room's state comes again after a reconnect, who was there
    // is shown dimmed.
    $("lobby-members").toggleAttribute("data-stale", lobby.state !== "joined");
    // An invisible user is no member for anyone, themselves included: the
    // count is then of the others.
    const n = lobby.count;
    $("lobby-count").textContent = n === 1 && lobby.members.has(me) ? "(just you)" : n === 1 ? "(1 person)" : `(${n} people)`;
    renderTyping();
  }

  function renderTyping() {
    const names = lobby.typingUsers.filter((id) => id !== me).map((id) => look(lobby.member(id) ?? { user_id: id, conns: [] }).name);
    $("lobby-typing").textContent = typingText(names);
  }

  for (const ev of ["join", "leave", "update", "sync"]) lobby.on(ev, renderLobby);
  lobby.on("typing", renderTyping);
  client.onState(renderLobby);
  lobby.on("denied", (d) => {
    $("lobby-typing").textContent = `Not let into the lobby (${d.reason.replaceAll("_", " ")}).`;
  });
  // A lobby that ended (the client closed for good) takes no typing.
  $("lobby-input").addEventListener("input", () => {
    if (lobby.state === "joining" || lobby.state === "joined") lobby.typing();
  });

  client.onChange((id) => render(id));
  client.onDenied((d) => {
    denied.set(d.user_id, d.reason);
    render(d.user_id);
  });
  client.onError((e) => console.warn(`greendot: ${e.code}: ${e.message}`));

  refresh();
  const poll = number("graph_poll_ms") ?? 3000;
  setInterval(() => {
    if (document.visibilityState === "visible") refresh();
  }, Math.max(poll, 250));
  setInterval(() => {
    for (const id of graph.following.keys()) render(id);
  }, 10_000);

  window.demo = { client, me, refresh, states, lobby };
}

const me = params.get("user");
if (me !== null && validUserId(me)) start(me);
else pick();
