// greendot.js: the browser client of greendot presence (online, away, busy,
// offline). An ES module with no dependencies and no build step; the gateway
// serves it at /greendot.js, and the same file is the npm package
// @greendot/client. The protocol it speaks is docs/protocol.md.
//
//   import { GreenDot } from "/greendot.js";
//   const gd = new GreenDot({ token: () => fetchToken() });
//   gd.onChange((userId, p) => render(userId, p.status, p.last_seen));
//   gd.subscribe(["bob", "carol"]);
//   gd.setStatus("busy");
//   const room = gd.room("doc:42", { name: "Alice" });
//   room.on("join", (m) => addAvatar(m.user_id, m.conns[0].meta));
//
// What it takes care of: heartbeats at the interval the server asks for;
// reconnecting with capped exponential backoff and full jitter (and soon,
// with jitter, when a gateway drains with close code 1001); subscriptions,
// rooms (re-synced from the server's new state) and the chosen status
// restored after every reconnect; `activity` on input
// and focus (at most once per activityIntervalMs), `idle` when the tab has
// been hidden idleAfterMs, and the socket closed after closeAfterMs hidden,
// then opened again when the tab is visible.

/** The statuses a user may choose. */
export const STATUSES = Object.freeze(["online", "away", "busy", "invisible"]);

/** The most user ids the gateway takes in one subscribe message. */
export const MAX_SUBSCRIBE_IDS = 100;

/** The largest client message the gateway takes by default, in bytes. */
export const MAX_MESSAGE_BYTES = 4096;

/** The connection states, in the order a connection normally goes through them. */
export const STATES = Object.freeze(["new", "connecting", "open", "reconnecting", "suspended", "closed"]);

/** Default options; see greendot.d.ts for what each means. */
export const DEFAULTS = Object.freeze({
  backoffBaseMs: 500,
  backoffMaxMs: 30_000,
  drainJitterMs: 1_000,
  stableAfterMs: 10_000,
  idleAfterMs: 30_000,
  closeAfterMs: 300_000,
  activityIntervalMs: 30_000,
  trackVisibility: true,
  connect: true,
});

/** The largest room meta the gateway takes, in bytes of JSON. */
export const MAX_META_BYTES = 1024;

/** The largest signal data the client sends, in bytes of JSON. */
export const MAX_SIGNAL_BYTES = 256;

/** Room.typing() sends at most one typing frame per this many ms. */
export const TYPING_INTERVAL_MS = 2000;

/** How long a signal lasts when the server does not say (expires_ms). */
export const SIGNAL_EXPIRES_MS = 3000;

const EVENTS = new Set(["change", "self", "state", "denied", "error"]);
const ROOM_EVENTS = new Set(["join", "leave", "update", "sync", "signal", "typing", "denied", "error"]);
const USER_ID = /^[A-Za-z0-9_-]{1,64}$/;
const ROOM_ID = /^[A-Za-z0-9_:-]{1,128}$/;
const SIGNAL = /^[a-z0-9_-]{1,32}$/;
const DEVICE = /^[A-Za-z0-9_. -]{1,32}$/;
const ACTIVITY_EVENTS = ["pointerdown", "pointermove", "keydown", "wheel", "touchstart"];

/**
 * backoffDelay returns how long to wait before reconnect attempt number
 * `attempt` (0 for the first retry): "full jitter", a uniformly random delay
 * from 0 up to min(maxMs, baseMs * 2^attempt), so that many clients cut off
 * at once do not come back at once.
 */
export function backoffDelay(attempt, baseMs, maxMs, random = Math.random) {
  const cap = Math.min(maxMs, baseMs * 2 ** Math.min(Math.max(attempt, 0), 30));
  return Math.floor(random() * cap);
}

/** validUserId reports whether s is a user id: 1 to 64 of A-Z a-z 0-9 _ -. */
export function validUserId(s) {
  return typeof s === "string" && USER_ID.test(s);
}

/**
 * validRoomId reports whether s is a room id: 1 to 128 characters of
 * A-Z a-z 0-9 _ - and ':' (a namespace separator: "doc:42"), other than
 * "lease_ended", which the server keeps for itself.
 */
export function validRoomId(s) {
  return typeof s === "string" && ROOM_ID.test(s) && s !== "lease_ended";
}

const realClock = {
  now: () => Date.now(),
  setTimeout: (fn, ms) => setTimeout(fn, ms),
  clearTimeout: (id) => clearTimeout(id),
};

/**
 * Throttle calls fn at most once per intervalMs: a call outside the window
 * runs fn at once; calls inside it are folded into one call at the end of
 * the window, so the last sign of use is never lost. The clock is
 * replaceable for tests.
 */
export class Throttle {
  #fn;
  #interval;
  #clock;
  #last = -Infinity;
  #timer = null;

  constructor(fn, intervalMs, clock = realClock) {
    if (typeof fn !== "function") throw new TypeError("Throttle: fn must be a function");
    checkDuration("intervalMs", intervalMs);
    this.#fn = fn;
    this.#interval = intervalMs;
    this.#clock = clock;
  }

  /** call runs fn now, or once at the end of the current window. */
  call() {
    const now = this.#clock.now();
    const wait = this.#last + this.#interval - now;
    if (wait <= 0) {
      this.#fire(now);
    } else if (this.#timer === null) {
      this.#timer = this.#clock.setTimeout(() => {
        this.#timer = null;
        this.#fire(this.#clock.now());
      }, wait);
    }
  }

  /** pending reports whether a folded call waits for the end of the window. */
  get pending() {
    return this.#timer !== null;
  }

  /** cancel drops a folded call; the window stays. */
  cancel() {
    if (this.#timer !== null) {
      this.#clock.clearTimeout(this.#timer);
      this.#timer = null;
    }
  }

  /** reset drops a folded call and the window: the next call runs at once. */
  reset() {
    this.cancel();
    this.#last = -Infinity;
  }

  #fire(now) {
    this.#last = now;
    this.#fn();
  }
}

function checkDuration(name, v) {
  if (typeof v !== "number" || !Number.isFinite(v) || v < 0) {
    throw new TypeError(`greendot: ${name} must be a finite number of milliseconds, at least 0 (got ${v})`);
  }
}

// report reports an exception thrown by a listener without letting it
// break the client: as an uncaught error in a browser, on the console
// elsewhere (where an uncaught error could end the process).
function report(err) {
  if (typeof reportError === "function") reportError(err);
  else console.error("greendot: a listener threw:", err);
}

/**
 * subscribeChunks splits ids into subscribe (or unsubscribe) messages that
 * the gateway takes: at most MAX_SUBSCRIBE_IDS ids, and at most
 * MAX_MESSAGE_BYTES bytes of JSON each (ids are ASCII).
 */
export function subscribeChunks(ids, type = "subscribe") {
  const overhead = `{"type":"${type}","id":"s-000000000000","user_ids":[]}`.length;
  const chunks = [];
  let cur = [];
  let size = overhead;
  for (const id of ids) {
    const add = id.length + 3; // quotes and comma
    if (cur.length > 0 && (cur.length >= MAX_SUBSCRIBE_IDS || size + add > MAX_MESSAGE_BYTES)) {
      chunks.push(cur);
      cur = [];
      size = overhead;
    }
    cur.push(id);
    size += add;
  }
  if (cur.length > 0) chunks.push(cur);
  return chunks;
}

/**
 * GreenDot is one connection to greendot, kept open across network trouble,
 * gateway restarts and hidden tabs. Create one per page.
 */
export class GreenDot {
  #opts;
  #WS;
  #ws = null;
  #state = "new";
  #listeners = new Map();
  #wanted = new Set();
  #presence = new Map();
  #pending = new Map(); // message id -> subscribe request
  #rooms = new Map(); // room id -> the link to its Room
  #self = null;
  #hello = null;
  #helloAt = 0;
  #chosen;
  // #chosenSent: #chosen was sent and no self frame confirmed it yet; the self
  // frames before the confirmation show an earlier status.
  #chosenSent = false;
  #token;
  #seq = 0;
  #connectSeq = 0;
  #attempt = 0;
  #retryTimer = null;
  #heartbeatTimer = null;
  #idleTimer = null;
  #closeTimer = null;
  #idleSent = false;
  #suspended = false;
  #closed = false;
  #activity;
  #detach = [];

  constructor(options = {}) {
    if (options === null || typeof options !== "object") throw new TypeError("greendot: options must be an object");
    // An option given as undefined takes its default.
    const o = { ...DEFAULTS };
    for (const [k, v] of Object.entries(options)) if (v !== undefined) o[k] = v;
    for (const k of ["backoffBaseMs", "backoffMaxMs", "drainJitterMs", "stableAfterMs", "idleAfterMs", "closeAfterMs", "activityIntervalMs"]) {
      checkDuration(k, o[k]);
    }
    if (o.backoffBaseMs <= 0) throw new TypeError("greendot: backoffBaseMs must be more than 0");
    if (o.backoffMaxMs < o.backoffBaseMs) throw new TypeError("greendot: backoffMaxMs must be at least backoffBaseMs");
    if (o.token === undefined && o.user === undefined) {
      throw new TypeError("greendot: give a token (a JWT, or a function returning one) or, with dev auth, a user");
    }
    if (o.token !== undefined && typeof o.token !== "string" && typeof o.token !== "function") {
      throw new TypeError("greendot: token must be a string or a function returning one");
    }
    if (o.user !== undefined && !validUserId(o.user)) {
      throw new TypeError(`greendot: user must be 1 to 64 characters of A-Z a-z 0-9 _ - (got ${JSON.stringify(o.user)})`);
    }
    if (o.device !== undefined && (typeof o.device !== "string" || !DEVICE.test(o.device))) {
      throw new TypeError(`greendot: device must be 1 to 32 characters of A-Z a-z 0-9 _ - . and space (got ${JSON.stringify(o.device)})`);
    }
    if (o.status !== undefined) checkStatus(o.status);
    this.#WS = o.WebSocket ?? globalThis.WebSocket;
    if (typeof this.#WS !== "function") throw new TypeError("greendot: no WebSocket here; pass options.WebSocket");
    this.#opts = o;
    this.#token = o.token;
    this.#chosen = o.status;
    this.#url(""); // fail now on a bad url
    this.#activity = new Throttle(() => this.#send({ type: "activity" }), o.activityIntervalMs);
    if (o.trackVisibility && typeof document !== "undefined" && typeof window !== "undefined") {
      this.#watchPage();
    }
    // Connect once the caller had the chance to add listeners, so that
    // they see every event, the first "connecting" included.
    if (o.connect) {
      queueMicrotask(() => {
        if (this.#state === "new" && !this.#closed) this.connect();
      });
    }
  }

  /** The connection state: new, connecting, open, reconnecting, suspended or closed. */
  get state() {
    return this.#state;
  }

  /** The user's own true status and live device count, from the last self frame; null before one. */
  get self() {
    return this.#self;
  }

  /** The hello frame of the open connection (user_id, conn_id, heartbeat_interval_ms, ttl_ms, status); null when not open. */
  get hello() {
    return this.#hello;
  }

  /** The status this client chose with setStatus (or options.status), re-sent after every reconnect; undefined if none. */
  get chosenStatus() {
    return this.#chosen;
  }

  /** The ids this client watches: subscribed, and not denied or unsubscribed since. */
  get subscriptions() {
    return [...this.#wanted];
  }

  /** The rooms this client is in or joining: not left, and not denied. */
  get rooms() {
    return [...this.#rooms.values()].map((link) => link.room);
  }

  /** on adds a listener for "change", "self", "state", "denied" or "error", and returns a function that removes it. */
  on(event, fn) {
    if (!EVENTS.has(event)) throw new TypeError(`greendot: unknown event ${JSON.stringify(event)}`);
    if (typeof fn !== "function") throw new TypeError("greendot: listener must be a function");
    let set = this.#listeners.get(event);
    if (!set) this.#listeners.set(event, (set = new Set()));
    const entry = (...args) => fn(...args);
    set.add(entry);
    return () => set.delete(entry);
  }

  /** onChange calls fn(userId, presence) whenever a watched user's presence changes. */
  onChange(fn) {
    return this.on("change", fn);
  }

  /** onSelf calls fn({status, devices}) when the user's own true status or device count changes. */
  onSelf(fn) {
    return this.on("self", fn);
  }

  /** onState calls fn(state, detail) on every connection state change. */
  onState(fn) {
    return this.on("state", fn);
  }

  /** onDenied calls fn({user_id, reason, id}) when a subscription is refused or revoked. */
  onDenied(fn) {
    return this.on("denied", fn);
  }

  /** onError calls fn({code, message, id}) for error frames and for client-side failures. */
  onError(fn) {
    return this.on("error", fn);
  }

  /** presence returns the last known presence of a watched user, or undefined. */
  presence(userId) {
    return this.#presence.get(userId);
  }

  /** presences returns a copy of every known presence, by user id. */
  presences() {
    return new Map(this.#presence);
  }

  /** connect opens the connection if it is new, suspended or waiting to retry. */
  connect() {
    if (this.#closed) throw new Error("greendot: the client is closed; create a new one");
    if (this.#state === "connecting" || this.#state === "open") return;
    this.#suspended = false;
    this.#clearRetry();
    this.#open();
  }

  /** close closes the connection for good, removes page listeners and rejects pending subscribes. */
  close() {
    if (this.#closed) return;
    this.#closed = true;
    this.#clearRetry();
    this.#clearHidden();
    this.#activity.cancel();
    for (const off of this.#detach) off();
    this.#detach = [];
    const ws = this.#ws;
    this.#dropSocket();
    if (ws) ws.close(1000, "client closed");
    for (const req of this.#pending.values()) req.reject(new Error("greendot: client closed"));
    this.#pending.clear();
    for (const link of [...this.#rooms.values()]) link.end();
    this.#rooms.clear();
    this.#setState("closed", {});
  }

  /**
   * subscribe starts watching users. Their presence arrives through
   * onChange, now and after every reconnect. The promise resolves with the
   * first answer: {users, denied}. A denied user is not watched.
   */
  subscribe(ids) {
    const list = checkIds(ids);
    if (this.#closed) return Promise.reject(new Error("greendot: client closed"));
    for (const id of list) this.#wanted.add(id);
    const open = this.#state === "open";
    const parts = subscribeChunks(list).map((chunk) => this.#request(chunk, open));
    const answer = Promise.all(parts).then((answers) => ({
      users: answers.flatMap((a) => a.users),
      denied: answers.flatMap((a) => a.denied),
    }));
    // Most callers rely on onChange and never await this: a rejection they
    // ignore (the client closed, or an error frame, which onError also
    // reports) must not surface as an unhandled rejection.
    answer.catch(() => {});
    return answer;
  }

  /** unsubscribe stops watching users and forgets their presence. */
  unsubscribe(ids) {
    const list = checkIds(ids).filter((id) => this.#wanted.delete(id));
    for (const id of list) this.#presence.delete(id);
    if (this.#state === "open") {
      for (const chunk of subscribeChunks(list, "unsubscribe")) this.#send({ type: "unsubscribe", user_ids: chunk });
    }
  }

  /** setStatus chooses the user's status (online, away, busy or invisible) for all their devices. */
  setStatus(status) {
    checkStatus(status);
    this.#chosen = status;
    // A choice the user already has is not confirmed by a self frame; one
    // made before hello is sent, or not, once it comes.
    if (this.#state === "open") this.#chosenSent = this.#self?.status !== status;
    this.#send({ type: "set_status", status });
  }

  /**
   * room joins a room ("doc:42") with this connection's meta, a JSON object
   * of at most MAX_META_BYTES that the other members see (a name, a
   * colour), and returns the Room: its members, and events as they come
   * and go. The room is joined again after every reconnect, with the
   * newest meta. For a room this client is already in it returns the same
   * Room, and a meta given replaces the one it had.
   */
  room(id, meta) {
    if (!validRoomId(id)) {
      throw new TypeError(`greendot: a room id is 1 to 128 characters of A-Z a-z 0-9 _ - and : (got ${JSON.stringify(id)})`);
    }
    if (meta !== undefined) checkMeta(meta);
    if (this.#closed) throw new Error("greendot: the client is closed; create a new one");
    const have = this.#rooms.get(id);
    if (have) {
      if (meta !== undefined) have.room.updateMeta(meta);
      return have.room;
    }
    const link = {
      send: (msg) => this.#send(msg),
      open: () => this.#hello !== null,
      nextId: () => this.#nextId("r"),
      forget: () => {
        if (this.#rooms.get(id) === link) this.#rooms.delete(id);
      },
    };
    link.room = new Room(id, meta, link);
    this.#rooms.set(id, link);
    if (this.#hello !== null) link.join();
    return link.room;
  }

  /**
   * setToken gives a fresh token: it is sent on the open connection (an
   * `auth` message) and used for every later connection.
   */
  setToken(token) {
    if (typeof token !== "string" || token === "") throw new TypeError("greendot: token must be a non-empty string");
    this.#token = token;
    this.#send({ type: "auth", token });
  }

  /**
   * send sends one protocol message as it is and reports whether the
   * connection was open to take it. Most apps never need it.
   */
  send(message) {
    if (message === null || typeof message !== "object" || typeof message.type !== "string") {
      throw new TypeError('greendot: a message is an object with a string "type"');
    }
    return this.#send(message);
  }

  // --- connection ---

  async #open() {
    const seq = ++this.#connectSeq;
    this.#setState("connecting", { attempt: this.#attempt });
    let url;
    try {
      const token = typeof this.#token === "function" ? await this.#token() : this.#token;
      if (token !== undefined && (typeof token !== "string" || token === "")) {
        throw new TypeError("the token function must return a non-empty string");
      }
      url = this.#url(token);
    } catch (err) {
      if (seq !== this.#connectSeq || this.#closed || this.#suspended) return;
      this.#emit("error", { code: "token_failed", message: `greendot: could not get a token: ${err?.message ?? err}` });
      this.#retry({ code: 0, reason: "token_failed" });
      return;
    }
    if (seq !== this.#connectSeq || this.#closed || this.#suspended) return;
    let ws;
    try {
      ws = new this.#WS(url);
    } catch (err) {
      this.#emit("error", { code: "connect_failed", message: `greendot: ${err?.message ?? err}` });
      this.#retry({ code: 0, reason: "connect_failed" });
      return;
    }
    this.#ws = ws;
    ws.onmessage = (ev) => {
      if (ws === this.#ws) this.#message(ev.data);
    };
    ws.onclose = (ev) => {
      if (ws === this.#ws) this.#lost(ev.code, ev.reason);
    };
    ws.onerror = () => {}; // a close event follows, with the code
  }

  #url(token) {
    const o = this.#opts;
    const base = typeof location !== "undefined" ? location.href : undefined;
    let u;
    if (o.url !== undefined) {
      try {
        u = new URL(o.url, base);
      } catch {
        throw new TypeError(`greendot: bad url ${JSON.stringify(o.url)}`);
      }
    } else if (base !== undefined) {
      u = new URL("/ws", base);
    } else {
      throw new TypeError("greendot: no url given and no page location to derive one from");
    }
    if (u.protocol === "http:") u.protocol = "ws:";
    else if (u.protocol === "https:") u.protocol = "wss:";
    else if (u.protocol !== "ws:" && u.protocol !== "wss:") throw new TypeError(`greendot: url must be ws, wss, http or https (got ${u.protocol})`);
    if (u.pathname === "/" || u.pathname === "") u.pathname = "/ws";
    u.hash = "";
    if (token) u.searchParams.set("token", token);
    else if (o.user !== undefined) u.searchParams.set("user", o.user);
    if (o.device !== undefined) u.searchParams.set("device", o.device);
    return u.toString();
  }

  // lost handles the end of the open socket.
  #lost(code, reason) {
    const wasOpen = this.#hello !== null;
    const lived = wasOpen ? Date.now() - this.#helloAt : 0;
    this.#dropSocket();
    if (this.#closed || this.#suspended) return;
    if (wasOpen && lived >= this.#opts.stableAfterMs) this.#attempt = 0;
    this.#retry({ code, reason });
  }

  // retry schedules the next connection attempt.
  #retry(detail) {
    let delay;
    if (detail.code === 1001) {
      // The gateway is draining: come back soon, but not all at once.
      this.#attempt = 0;
      delay = Math.floor(Math.random() * this.#opts.drainJitterMs);
    } else {
      delay = backoffDelay(this.#attempt, this.#opts.backoffBaseMs, this.#opts.backoffMaxMs);
      this.#attempt++;
    }
    this.#clearRetry();
    this.#retryTimer = setTimeout(() => {
      this.#retryTimer = null;
      this.#open();
    }, delay);
    this.#setState("reconnecting", { ...detail, delay, attempt: this.#attempt });
  }

  #clearRetry() {
    if (this.#retryTimer !== null) {
      clearTimeout(this.#retryTimer);
      this.#retryTimer = null;
    }
  }

  #dropSocket() {
    const ws = this.#ws;
    this.#ws = null;
    this.#hello = null;
    this.#connectSeq++;
    if (this.#heartbeatTimer !== null) {
      clearInterval(this.#heartbeatTimer);
      this.#heartbeatTimer = null;
    }
    if (ws) {
      ws.onmessage = null;
      ws.onclose = null;
    }
    for (const link of this.#rooms.values()) link.lost();
  }

  #send(msg) {
    const ws = this.#ws;
    if (!ws || this.#hello === null || ws.readyState !== 1) return false;
    const data = JSON.stringify(msg);
    // A UTF-16 unit is at most 3 bytes of UTF-8: count bytes only when it matters.
    const bytes = data.length * 3 <= MAX_MESSAGE_BYTES ? data.length : new TextEncoder().encode(data).length;
    if (bytes > MAX_MESSAGE_BYTES) throw new RangeError(`greendot: a message of ${bytes} bytes is over ${MAX_MESSAGE_BYTES}`);
    ws.send(data);
    return true;
  }

  #setState(state, detail) {
    if (state === this.#state && state !== "reconnecting") return;
    this.#state = state;
    this.#emit("state", state, detail);
  }

  #emit(event, ...args) {
    const set = this.#listeners.get(event);
    if (!set) return;
    for (const fn of [...set]) {
      try {
        fn(...args);
      } catch (err) {
        report(err);
      }
    }
  }

  // --- frames ---

  #message(data) {
    if (typeof data !== "string") return; // the gateway sends text frames only
    let m;
    try {
      m = JSON.parse(data);
    } catch {
      this.#emit("error", { code: "bad_frame", message: "greendot: the server sent a frame that is not JSON" });
      return;
    }
    if (m === null || typeof m !== "object") return;
    switch (m.type) {
      case "hello":
        this.#opened(m);
        break;
      case "presence_init":
        for (const p of Array.isArray(m.users) ? m.users : []) this.#update(p);
        this.#answered(m.id, (req) => {
          req.init = true;
          for (const p of Array.isArray(m.users) ? m.users : []) {
            if (req.remaining.delete(p.user_id)) req.users.push(p);
          }
        });
        break;
      case "presence_batch":
        for (const p of Array.isArray(m.updates) ? m.updates : []) this.#update(p);
        break;
      case "self":
        this.#selfFrame(m);
        break;
      case "denied":
        this.#denied(m);
        break;
      case "room_state":
      case "room_diff":
      case "room_signal":
      case "room_denied":
        if (typeof m.room === "string") this.#rooms.get(m.room)?.frame(m);
        break;
      case "error": {
        const err = Object.freeze({ code: String(m.code ?? ""), message: String(m.message ?? ""), id: m.id });
        const req = m.id !== undefined ? this.#pending.get(m.id) : undefined;
        if (req) {
          this.#pending.delete(m.id);
          req.reject(Object.assign(new Error(`greendot: ${err.code}: ${err.message}`), { code: err.code }));
        }
        if (m.id !== undefined) {
          for (const link of [...this.#rooms.values()]) if (link.error(err)) break;
        }
        this.#emit("error", err);
        break;
      }
      default:
        // A message type from a newer server: ignore it.
    }
  }

  #opened(hello) {
    this.#hello = Object.freeze({ ...hello });
    this.#helloAt = Date.now();
    const every = Number(hello.heartbeat_interval_ms) > 0 ? Math.max(Number(hello.heartbeat_interval_ms), 100) : 15_000;
    this.#heartbeatTimer = setInterval(() => this.#send({ type: "heartbeat" }), every);
    this.#setState("open", { user_id: hello.user_id, conn_id: hello.conn_id });
    this.#chosenSent = this.#chosen !== undefined && this.#chosen !== hello.status;
    if (this.#chosenSent) this.#send({ type: "set_status", status: this.#chosen });
    this.#resubscribe();
    for (const link of [...this.#rooms.values()]) link.join();
    if (this.#idleSent) this.#send({ type: "idle" });
    else this.#activity.reset();
  }

  // resubscribe asks again for every watched user: first the requests still
  // waiting for an answer, then the rest.
  #resubscribe() {
    const asked = new Set();
    for (const [id, req] of [...this.#pending]) {
      const ids = req.ids.filter((u) => this.#wanted.has(u));
      if (ids.length === 0) {
        this.#pending.delete(id);
        req.resolve({ users: [], denied: [] });
        continue;
      }
      req.ids = ids;
      req.remaining = new Set(ids);
      req.users = [];
      req.denied = [];
      req.init = false;
      for (const u of ids) asked.add(u);
      this.#send({ type: "subscribe", id, user_ids: ids });
    }
    const rest = [...this.#wanted].filter((u) => !asked.has(u));
    for (const chunk of subscribeChunks(rest)) this.#send({ type: "subscribe", id: this.#nextId(), user_ids: chunk });
  }

  #request(ids, send) {
    return new Promise((resolve, reject) => {
      const id = this.#nextId();
      this.#pending.set(id, { ids, remaining: new Set(ids), users: [], denied: [], init: false, resolve, reject });
      if (send) this.#send({ type: "subscribe", id, user_ids: ids });
    });
  }

  #nextId(prefix = "s") {
    this.#seq++;
    return `${prefix}-${this.#seq}`;
  }

  // answered applies part of an answer to the request with this id, and
  // resolves the request once every id in it is accounted for.
  #answered(id, apply) {
    if (id === undefined) return;
    const req = this.#pending.get(id);
    if (!req) return;
    apply(req);
    if (req.init && req.remaining.size === 0) {
      this.#pending.delete(id);
      req.resolve({ users: req.users, denied: req.denied });
    }
  }

  #update(p) {
    if (p === null || typeof p !== "object" || !validUserId(p.user_id) || typeof p.status !== "string") return;
    if (!this.#wanted.has(p.user_id)) return; // unsubscribed meanwhile
    const prev = this.#presence.get(p.user_id);
    const next = Object.freeze({ ...p });
    if (prev && prev.status === next.status && prev.last_seen === next.last_seen) return;
    this.#presence.set(p.user_id, next);
    this.#emit("change", p.user_id, next);
  }

  #selfFrame(m) {
    const next = Object.freeze({ status: m.status, devices: Number(m.devices) || 0 });
    // Another device chose a status: adopt it, so that a reconnect of this
    // one does not undo that choice. An automatic away is not a choice, and
    // until this one's own choice is confirmed (or turned away because the
    // user is idle) a self frame shows an earlier status.
    if (this.#chosen === undefined) {
      // nothing chosen here: nothing to keep
    } else if (this.#chosenSent) {
      this.#chosenSent = m.status !== this.#chosen && m.status !== "away";
    } else if (m.status !== this.#chosen && m.status !== "away" && STATUSES.includes(m.status)) {
      this.#chosen = m.status;
    }
    const prev = this.#self;
    this.#self = next;
    if (!prev || prev.status !== next.status || prev.devices !== next.devices) this.#emit("self", next);
  }

  #denied(m) {
    const d = Object.freeze({ user_id: m.user_id, reason: m.reason, id: m.id });
    if (typeof m.user_id === "string") {
      this.#wanted.delete(m.user_id);
      this.#presence.delete(m.user_id);
    }
    this.#answered(m.id, (req) => {
      if (req.remaining.delete(m.user_id)) req.denied.push(d);
    });
    this.#emit("denied", d);
  }

  // --- page visibility and activity ---

  #watchPage() {
    const listen = (target, type, fn, opts) => {
      target.addEventListener(type, fn, opts);
      this.#detach.push(() => target.removeEventListener(type, fn, opts));
    };
    listen(document, "visibilitychange", () => this.#visibility());
    const active = () => this.#active();
    for (const type of ACTIVITY_EVENTS) listen(window, type, active, { capture: true, passive: true });
    listen(window, "focus", active);
    listen(window, "online", () => {
      if (this.#state === "reconnecting") {
        this.#attempt = 0;
        this.connect();
      }
    });
    if (document.visibilityState === "hidden") this.#hidden();
  }

  #visibility() {
    if (this.#closed) return;
    if (document.visibilityState === "hidden") {
      this.#hidden();
      return;
    }
    this.#clearHidden();
    if (this.#suspended) {
      this.#attempt = 0;
      this.#idleSent = false;
      this.connect();
      return;
    }
    this.#active();
  }

  #hidden() {
    this.#clearHidden();
    this.#idleTimer = setTimeout(() => {
      this.#idleTimer = null;
      this.#idleSent = true;
      this.#activity.cancel();
      this.#send({ type: "idle" });
    }, this.#opts.idleAfterMs);
    this.#closeTimer = setTimeout(() => {
      this.#closeTimer = null;
      this.#suspend();
    }, this.#opts.closeAfterMs);
  }

  #clearHidden() {
    if (this.#idleTimer !== null) clearTimeout(this.#idleTimer);
    if (this.#closeTimer !== null) clearTimeout(this.#closeTimer);
    this.#idleTimer = this.#closeTimer = null;
  }

  // suspend closes the socket of a tab hidden for closeAfterMs; it opens
  // again when the tab is visible.
  #suspend() {
    if (this.#closed || this.#state === "new") return; // not connected yet: nothing to pause
    this.#suspended = true;
    this.#clearRetry();
    const ws = this.#ws;
    this.#dropSocket();
    if (ws) ws.close(1000, "tab hidden");
    this.#setState("suspended", {});
  }

  #active() {
    if (this.#closed || (typeof document !== "undefined" && document.visibilityState === "hidden")) return;
    if (this.#idleSent) {
      // Back from idle: say so at once.
      this.#idleSent = false;
      this.#activity.reset();
    }
    this.#activity.call();
  }
}

function checkStatus(s) {
  if (!STATUSES.includes(s)) {
    throw new TypeError(`greendot: status must be one of ${STATUSES.join(", ")} (got ${JSON.stringify(s)})`);
  }
}

function checkIds(ids) {
  if (typeof ids === "string") ids = [ids];
  if (ids === null || typeof ids !== "object" || typeof ids[Symbol.iterator] !== "function") {
    throw new TypeError("greendot: user ids must be an array of strings");
  }
  const out = [...new Set(ids)];
  const bad = out.filter((id) => !validUserId(id));
  if (bad.length > 0) {
    throw new TypeError(`greendot: user ids are 1 to 64 characters of A-Z a-z 0-9 _ - (bad: ${bad.slice(0, 5).map((b) => JSON.stringify(b)).join(", ")})`);
  }
  return out;
}

// utf8Bytes returns the length of s in bytes of UTF-8, counting them only
// when it may be over limit (a UTF-16 unit is at most 3 bytes of UTF-8).
function utf8Bytes(s, limit) {
  return s.length * 3 <= limit ? s.length : new TextEncoder().encode(s).length;
}

function checkMeta(meta) {
  if (meta === null || typeof meta !== "object" || Array.isArray(meta)) {
    throw new TypeError("greendot: a room meta is a JSON object ({name: ..., color: ...})");
  }
  let data;
  try {
    data = JSON.stringify(meta);
  } catch (err) {
    throw new TypeError(`greendot: a room meta must be JSON: ${err?.message ?? err}`);
  }
  const bytes = utf8Bytes(data, MAX_META_BYTES);
  if (bytes > MAX_META_BYTES) throw new RangeError(`greendot: a room meta of ${bytes} bytes of JSON is over ${MAX_META_BYTES}`);
}

function checkSignal(type, data) {
  if (typeof type !== "string" || !SIGNAL.test(type)) {
    throw new TypeError(`greendot: a signal is 1 to 32 characters of a-z 0-9 _ - (got ${JSON.stringify(type)})`);
  }
  if (data === undefined) return;
  let s;
  try {
    s = JSON.stringify(data);
  } catch (err) {
    throw new TypeError(`greendot: signal data must be JSON: ${err?.message ?? err}`);
  }
  if (s === undefined) throw new TypeError("greendot: signal data must be JSON");
  const bytes = utf8Bytes(s, MAX_SIGNAL_BYTES);
  if (bytes > MAX_SIGNAL_BYTES) throw new RangeError(`greendot: signal data of ${bytes} bytes of JSON is over ${MAX_SIGNAL_BYTES}`);
}

// readConns reads a member of a room frame into conns (conn id -> conn),
// and returns its user id, or undefined when it is not a member.
function readConns(member, conns, full) {
  if (member === null || typeof member !== "object" || !validUserId(member.user_id) || !Array.isArray(member.conns)) return undefined;
  for (const c of member.conns) {
    if (c === null || typeof c !== "object" || typeof c.conn_id !== "string" || c.conn_id === "") continue;
    if (!full) {
      conns.set(c.conn_id, null);
      continue;
    }
    const meta = c.meta !== null && typeof c.meta === "object" ? Object.freeze(c.meta) : Object.freeze({});
    conns.set(c.conn_id, Object.freeze({ conn_id: c.conn_id, meta, since: Number(c.since) || 0 }));
  }
  return member.user_id;
}

function sameConns(a, b) {
  if (a.size !== b.size) return false;
  for (const [id, c] of a) {
    const d = b.get(id);
    if (!d || d.since !== c.since || JSON.stringify(d.meta) !== JSON.stringify(c.meta)) return false;
  }
  return true;
}

/**
 * Room is this client's membership of one room, made by GreenDot.room: the
 * members (users, each with the connections they are in the room with and
 * the meta of each), kept in step with the server, and the signals its
 * members send (typing and the like). A user is a member while at least one
 * of their connections is in the room.
 */
class Room {
  #id;
  #meta;
  #link;
  #state = "joining";
  #listeners = new Map();
  #members = new Map(); // user id -> Map(conn id -> conn)
  #views = new Map(); // user id -> frozen member
  #count = 0;
  #truncated = false;
  #synced = false; // a room_state arrived on this connection
  #ids = new Set(); // ids of the join and room_update messages sent
  #typers = new Map(); // "user conn" -> {user_id, until}
  #typing = [];
  #typingTimer = null;
  #typingSent = -Infinity;

  constructor(id, meta, link) {
    this.#id = id;
    this.#meta = meta;
    this.#link = link;
    link.join = () => this.#join();
    link.lost = () => {
      this.#synced = false;
      if (this.#state === "joined") this.#state = "joining";
    };
    link.frame = (m) => this.#frame(m);
    link.error = (err) => {
      if (!this.#ids.has(err.id)) return false;
      this.#emit("error", err);
      return true;
    };
    link.end = () => this.#end("left");
  }

  /** The room id. */
  get id() {
    return this.#id;
  }

  /** This connection's meta in the room, as last given. */
  get meta() {
    return this.#meta;
  }

  /**
   * joining (not in the room on this connection yet: waiting for the
   * connection, or for the server's answer), joined, denied or left.
   */
  get state() {
    return this.#state;
  }

  /** The members, by user id (a copy): {user_id, conns: [{conn_id, meta, since}]}. */
  get members() {
    return new Map(this.#views);
  }

  /** How many users are in the room, as the server counts them; more than members.size when the list is truncated. */
  get count() {
    return this.#count;
  }

  /** Whether the server sent only part of the member list (a large room). */
  get truncated() {
    return this.#truncated;
  }

  /** The users typing now: a typing signal of theirs arrived within its expiry. */
  get typingUsers() {
    return [...this.#typing];
  }

  /** member returns a member by user id, or undefined. */
  member(userId) {
    return this.#views.get(userId);
  }

  /**
   * on adds a listener for "join", "leave", "update", "sync", "signal",
   * "typing", "denied" or "error", and returns a function that removes it.
   */
  on(event, fn) {
    if (!ROOM_EVENTS.has(event)) throw new TypeError(`greendot: unknown room event ${JSON.stringify(event)}`);
    if (typeof fn !== "function") throw new TypeError("greendot: listener must be a function");
    let set = this.#listeners.get(event);
    if (!set) this.#listeners.set(event, (set = new Set()));
    const entry = (...args) => fn(...args);
    set.add(entry);
    return () => set.delete(entry);
  }

  /**
   * updateMeta replaces this connection's meta in the room (and in every
   * later join), and reports whether it was sent now.
   */
  updateMeta(meta) {
    checkMeta(meta);
    this.#live();
    this.#meta = meta;
    if (!this.#link.open()) return false;
    return this.#link.send({ type: "room_update", id: this.#remember(this.#link.nextId()), room: this.#id, meta });
  }

  /**
   * typing says the person is typing: call it on every input. It sends at
   * most one frame per TYPING_INTERVAL_MS, and reports whether it sent one
   * (nothing is sent until the room is joined: the server takes signals
   * only after its room_state). The others see the person typing until
   * SIGNAL_EXPIRES_MS after the last frame.
   */
  typing() {
    this.#live();
    const now = Date.now();
    if (now - this.#typingSent < TYPING_INTERVAL_MS) return false;
    if (!this.#synced || !this.#link.send({ type: "typing", room: this.#id })) return false;
    this.#typingSent = now;
    return true;
  }

  /**
   * signal sends a short-lived signal to the other members: a type of 1 to
   * 32 characters of a-z 0-9 _ -, and optional JSON data of at most
   * MAX_SIGNAL_BYTES. It reports whether it was sent: only once the room
   * is joined on the open connection; signals are not kept for later.
   */
  signal(type, data) {
    checkSignal(type, data);
    this.#live();
    if (!this.#synced) return false;
    const msg = { type: "signal", room: this.#id, signal: type };
    if (data !== undefined) msg.data = data;
    return this.#link.send(msg);
  }

  /** leave leaves the room for good; client.room(id) joins it again. */
  leave() {
    if (this.#state === "left" || this.#state === "denied") return;
    this.#end("left");
    if (this.#link.open()) this.#link.send({ type: "leave", room: this.#id });
  }

  #live() {
    if (this.#state === "left" || this.#state === "denied") {
      throw new Error(`greendot: room ${this.#id} was ${this.#state}; join it again with client.room`);
    }
  }

  #remember(id) {
    this.#ids.add(id);
    if (this.#ids.size > 16) this.#ids.delete(this.#ids.values().next().value);
    return id;
  }

  #join() {
    this.#synced = false;
    this.#typingSent = -Infinity;
    const msg = { type: "join", id: this.#remember(this.#link.nextId()), room: this.#id };
    if (this.#meta !== undefined) msg.meta = this.#meta;
    this.#link.send(msg);
  }

  #end(state) {
    this.#state = state;
    this.#synced = false;
    this.#link.forget();
    this.#members = new Map();
    this.#views = new Map();
    this.#typers.clear();
    this.#typing = [];
    if (this.#typingTimer !== null) {
      clearTimeout(this.#typingTimer);
      this.#typingTimer = null;
    }
  }

  #frame(m) {
    if (this.#state === "left" || this.#state === "denied") return;
    switch (m.type) {
      case "room_state":
        this.#stateFrame(m);
        break;
      case "room_diff":
        // A diff before this connection's state is in that state.
        if (this.#synced) this.#diffFrame(m);
        break;
      case "room_signal":
        this.#signalFrame(m);
        break;
      case "room_denied": {
        const d = Object.freeze({ room: this.#id, reason: String(m.reason ?? ""), id: m.id });
        this.#end("denied");
        this.#emit("denied", d);
        break;
      }
    }
  }

  #setCount(m, fallback) {
    this.#count = typeof m.count === "number" && m.count >= 0 ? m.count : fallback;
  }

  #stateFrame(m) {
    const next = new Map();
    for (const member of Array.isArray(m.members) ? m.members : []) {
      const conns = new Map();
      const user = readConns(member, conns, true);
      if (user === undefined || conns.size === 0) continue;
      const have = next.get(user);
      if (have) for (const [id, c] of conns) have.set(id, c);
      else next.set(user, conns);
    }
    const users = new Set([...this.#members.keys(), ...next.keys()]);
    this.#truncated = m.truncated === true;
    this.#setCount(m, next.size);
    this.#synced = true;
    this.#state = "joined";
    this.#commit(next, users);
    this.#emit("sync", this.members);
  }

  #diffFrame(m) {
    const next = new Map(this.#members);
    const users = new Set();
    const edit = (user) => {
      if (!users.has(user)) {
        users.add(user);
        next.set(user, new Map(next.get(user) ?? []));
      }
      return next.get(user);
    };
    for (const member of Array.isArray(m.leaves) ? m.leaves : []) {
      const gone = new Map();
      const user = readConns(member, gone, false);
      if (user === undefined) continue;
      const conns = edit(user);
      for (const id of gone.keys()) conns.delete(id);
    }
    for (const member of Array.isArray(m.joins) ? m.joins : []) {
      const came = new Map();
      const user = readConns(member, came, true);
      if (user === undefined) continue;
      const conns = edit(user);
      for (const [id, c] of came) conns.set(id, c);
    }
    for (const user of users) if (next.get(user).size === 0) next.delete(user);
    this.#setCount(m, next.size);
    this.#commit(next, users);
  }

  // commit makes next the members, and tells the listeners how the users
  // in changed fared: joined, left or updated.
  #commit(next, changed) {
    const before = this.#members;
    const events = [];
    let typingGone = false;
    for (const user of changed) {
      const was = before.get(user);
      const now = next.get(user);
      for (const id of was?.keys() ?? []) {
        if (!now?.has(id)) typingGone = this.#typers.delete(`${user} ${id}`) || typingGone;
      }
      const prev = this.#views.get(user);
      if (!now) {
        if (prev) {
          this.#views.delete(user);
          events.push(["leave", prev]);
        }
        continue;
      }
      if (was && sameConns(was, now)) continue;
      const view = Object.freeze({ user_id: user, conns: Object.freeze([...now.values()]) });
      this.#views.set(user, view);
      events.push(prev ? ["update", view, prev] : ["join", view]);
    }
    this.#members = next;
    for (const [event, ...args] of events) this.#emit(event, ...args);
    if (typingGone) this.#expireTyping();
  }

  #signalFrame(m) {
    let typed = false;
    const now = Date.now();
    for (const s of Array.isArray(m.signals) ? m.signals : []) {
      if (s === null || typeof s !== "object" || !validUserId(s.user_id) || typeof s.signal !== "string") continue;
      const expires = typeof s.expires_ms === "number" && s.expires_ms >= 0 ? s.expires_ms : SIGNAL_EXPIRES_MS;
      if (s.signal === "typing") {
        this.#typers.set(`${s.user_id} ${s.conn_id}`, { user_id: s.user_id, until: now + expires });
        typed = true;
        continue;
      }
      this.#emit("signal", Object.freeze({
        user_id: s.user_id,
        conn_id: s.conn_id,
        signal: s.signal,
        data: s.data,
        expires_ms: expires,
        expires_at: now + expires,
      }));
    }
    if (typed) this.#expireTyping();
  }

  // expireTyping drops the typing signals that expired, sets a timer for
  // the next to expire, and tells the listeners when who is typing changed.
  #expireTyping() {
    if (this.#typingTimer !== null) {
      clearTimeout(this.#typingTimer);
      this.#typingTimer = null;
    }
    const now = Date.now();
    let next = Infinity;
    const users = new Set();
    for (const [key, t] of this.#typers) {
      if (t.until <= now) {
        this.#typers.delete(key);
        continue;
      }
      users.add(t.user_id);
      next = Math.min(next, t.until);
    }
    if (next !== Infinity) {
      this.#typingTimer = setTimeout(() => {
        this.#typingTimer = null;
        this.#expireTyping();
      }, next - now);
    }
    const typing = [...users];
    if (typing.length === this.#typing.length && typing.every((u, i) => u === this.#typing[i])) return;
    this.#typing = typing;
    this.#emit("typing", [...typing]);
  }

  #emit(event, ...args) {
    const set = this.#listeners.get(event);
    if (!set) return;
    for (const fn of [...set]) {
      try {
        fn(...args);
      } catch (err) {
        report(err);
      }
    }
  }
}
