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
// restored after every reconnect; requests paced to what the gateway
// takes, and sent again when it refuses them for now; the client closed
// for good after a close code that says not to come back as is (1002,
// 1003, 1007, 1009, and 1008 but for "token expired" with a token
// function), with an error event "refused"; `activity` on input
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

// The gateway handles a socket's requests (subscribe, unsubscribe, join,
// room_update, leave) in order, through a queue that takes 16 waiting
// ones, set_status messages included; one more is refused with an error
// rate_limited echoing its id, and changes nothing. So the client keeps at
// most REQUEST_WINDOW of its own requests waiting there, and sends the
// rest of its backlog as they are handled (#inFlight):
//
//   - subscribe and join are answered once handled (presence_init, or
//     denied; room_state), and as the gateway handles them in order, such
//     an answer also says that every request sent before it was handled.
//     They count until then.
//   - unsubscribe, room_update and leave have no answer. They need no
//     NATS, so the gateway handles them at once unless an answered request
//     of the client is still ahead of them: while one is, they count, and
//     its answer (or a later one) says they were handled. With none ahead
//     they count only for SETTLE_MS after they were sent, which paces a
//     burst of them. Counting them until a later answer instead could hold
//     the window forever, as nothing may be answered after them.
//
// An error or room_denied echoing a request's id may come before the
// requests ahead of it were handled (the gateway refuses some messages as
// it reads them), so it ends only that request. A request refused with
// rate_limited (the queue was full of set_status messages, or room_update
// was over its own rate), or a subscribe or join the gateway could not
// answer for want of NATS (unavailable), is sent again after a backoff,
// in the form the client wants now (#again); and so is every request
// waiting when the message rate limit dropped a message (an error
// rate_limited with no id), which may have been one of them (#dropped).
// Every request carries an id, and so do typing and signal, whose own
// rate's refusals are then told from the message rate limit's.

/** How many requests may wait at the gateway at once: half of what it takes, leaving room for set_status. */
const REQUEST_WINDOW = 8;
/** How long a request without an answer, sent with no answered one ahead of it, counts as waiting. */
const SETTLE_MS = 100;
/** How long a request without an answer is remembered once it counts no more, to recognise a refusal of it. */
const FORGET_AFTER_MS = 60_000;
/** A refused request is sent again after RETRY_BASE_MS, doubled per refusal until an answer comes, up to RETRY_MAX_MS. */
const RETRY_BASE_MS = 100;
const RETRY_MAX_MS = 5_000;
/** Requests go at most REQUEST_RATE a second after a burst of REQUEST_BURST: half the gateway's message rate limit. */
const REQUEST_RATE = 10;
const REQUEST_BURST = 20;
/** The requests the gateway answers once it has handled them. */
const ANSWERED = new Set(["subscribe", "join"]);

/** The close codes after which the client does not come back as is (docs/integration.md, step 6). */
const FINAL_CLOSE_CODES = new Set([1002, 1003, 1007, 1008, 1009]);

const EVENTS = new Set(["change", "self", "state", "denied", "error"]);
const ROOM_EVENTS = new Set(["join", "leave", "update", "sync", "signal", "typing", "denied", "error"]);
const USER_ID = /^[A-Za-z0-9_-]{1,64}$/;
const ROOM_ID = /^[A-Za-z0-9_:-]{1,128}$/;
const SIGNAL = /^[a-z0-9_-]{1,32}$/;
const DEVICE = /^[A-Za-z0-9_. -]{1,32}$/;
const PLATFORMS = ["web", "desktop", "mobile"];
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

// samePlatforms reports whether two presence objects' platforms say the same.
function samePlatforms(a, b) {
  return PLATFORMS.every((p) => (a?.[p] ?? "") === (b?.[p] ?? ""));
}

// sameCustom reports whether two custom statuses say the same.
function sameCustom(a, b) {
  return (a?.text ?? "") === (b?.text ?? "") && (a?.emoji ?? "") === (b?.emoji ?? "") && (a?.expires_at ?? 0) === (b?.expires_at ?? 0);
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
  #calls = new Set(); // subscribe calls not answered yet
  #pending = new Map(); // subscribe message id -> the calls it answers
  #backlog = []; // requests for the open connection not sent yet, in order
  #sent = []; // {msg, at}: requests sent on the open connection not known to be handled
  #tokens = REQUEST_BURST;
  #refilled = 0;
  #retryAt = 0;
  #refusals = 0;
  #flushTimer = null;
  #rooms = new Map(); // room id -> the link to its Room
  #self = null;
  #hello = null;
  #helloAt = 0;
  #chosen;
  // #chosenSent: #chosen was sent and no self frame confirmed it yet; the self
  // frames before the confirmation show an earlier status.
  #chosenSent = false;
  #token; // the newest token string: options.token, or setToken's
  #tokenFn; // options.token when it is a function: called before every connection
  #seq = 0;
  #connectSeq = 0;
  #attempt = 0;
  #retryTimer = null;
  #heartbeatTimer = null;
  #idleTimer = null;
  #closeTimer = null;
  #idleSent = false;
  #background = null; // the background message, once background() was called, until activity
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
    if (o.token !== undefined && (typeof o.token !== "string" || o.token === "") && typeof o.token !== "function") {
      throw new TypeError("greendot: token must be a non-empty string or a function returning one");
    }
    if (o.user !== undefined && !validUserId(o.user)) {
      throw new TypeError(`greendot: user must be 1 to 64 characters of A-Z a-z 0-9 _ - (got ${JSON.stringify(o.user)})`);
    }
    if (o.device !== undefined && (typeof o.device !== "string" || !DEVICE.test(o.device))) {
      throw new TypeError(`greendot: device must be 1 to 32 characters of A-Z a-z 0-9 _ - . and space (got ${JSON.stringify(o.device)})`);
    }
    if (o.platform !== undefined && !PLATFORMS.includes(o.platform)) {
      throw new TypeError(`greendot: platform must be web, desktop or mobile (got ${JSON.stringify(o.platform)})`);
    }
    if (o.status !== undefined) checkStatus(o.status);
    this.#WS = o.WebSocket ?? globalThis.WebSocket;
    if (typeof this.#WS !== "function") throw new TypeError("greendot: no WebSocket here; pass options.WebSocket");
    this.#opts = o;
    if (typeof o.token === "function") this.#tokenFn = o.token;
    else this.#token = o.token;
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

  /** onSelf calls fn({status, devices, custom_status?}) when the user's own true status, device count or custom status changes. */
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
    this.#shutdown({});
  }

  // shutdown ends the client for good; detail goes with the closed state.
  #shutdown(detail) {
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
    const calls = [...this.#calls];
    this.#calls.clear();
    this.#pending.clear();
    for (const req of calls) {
      req.done = true;
      req.reject(new Error("greendot: client closed"));
    }
    for (const link of [...this.#rooms.values()]) link.end();
    this.#rooms.clear();
    this.#setState("closed", detail);
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
    const answer = new Promise((resolve, reject) => {
      const req = { remaining: new Set(list), users: [], denied: [], done: false, resolve, reject };
      this.#calls.add(req);
      this.#settle(req); // no ids: answered at once
      // Before hello, the subscribes go out once it comes (#resubscribe).
      if (this.#hello === null) return;
      for (const chunk of subscribeChunks(list)) {
        const id = this.#nextId();
        this.#pending.set(id, [req]);
        this.#request({ type: "subscribe", id, user_ids: chunk });
      }
    });
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
    // Not open: the next connection subscribes only the users still watched.
    if (this.#hello === null) return;
    for (const chunk of subscribeChunks(list, "unsubscribe")) this.#request({ type: "unsubscribe", id: this.#nextId(), user_ids: chunk });
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
   * setCustomStatus sets the user's custom status for all their devices: a
   * text (at most 100 characters) and an emoji (a character or a shortcode
   * such as ":calendar:", at most 16), cleared by the server at expiresAt
   * (a Date, or unix seconds) if given. Empty text and emoji clear it. The
   * gateway answers a refused one with an "error" event, code
   * invalid_custom_status; a set one comes back in "self".
   */
  setCustomStatus(text = "", emoji = "", expiresAt = undefined) {
    if (typeof text !== "string" || typeof emoji !== "string") {
      throw new TypeError("greendot: a custom status's text and emoji must be strings");
    }
    let at = 0;
    if (expiresAt instanceof Date) at = Math.ceil(expiresAt.getTime() / 1000);
    else if (typeof expiresAt === "number" && Number.isInteger(expiresAt) && expiresAt > 0) at = expiresAt;
    else if (expiresAt !== undefined && expiresAt !== null) {
      throw new TypeError(`greendot: expiresAt must be a Date or whole unix seconds (got ${expiresAt})`);
    }
    const m = { type: "set_custom_status", text, emoji };
    if (at > 0) m.expires_at = at;
    this.#send(m);
  }

  /**
   * background says the app went to the background (for a mobile webview
   * or a native wrapper to call when the system suspends the app): the
   * user's connection is idle, and when its socket then closes or dies the
   * user stays away, not offline, for graceMs (at most the gateway's
   * --background-grace, which a call without graceMs gets). It is said
   * again on every reconnect until activity (input, or the tab shown)
   * ends it. Throws a TypeError for a graceMs that is not a positive
   * whole number.
   */
  background(graceMs) {
    if (graceMs !== undefined && (!Number.isInteger(graceMs) || graceMs <= 0)) {
      throw new TypeError(`greendot: graceMs must be a positive whole number of milliseconds (got ${JSON.stringify(graceMs)})`);
    }
    this.#background = graceMs === undefined ? { type: "background" } : { type: "background", grace_ms: graceMs };
    this.#idleSent = true;
    this.#activity.cancel();
    this.#send(this.#background);
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
      request: (msg) => this.#request(msg),
      // update puts meta into this room's join or room_update that waits
      // to be sent, if the last request of the room waiting is one.
      update: (meta) => {
        const last = this.#backlog.findLast((msg) => msg.room === id);
        if (last?.type !== "join" && last?.type !== "room_update") return false;
        last.meta = meta;
        return true;
      },
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
   * `auth` message). A later connection calls the token function, when
   * options.token is one, and uses this token otherwise.
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
      const token = this.#tokenFn !== undefined ? await this.#tokenFn() : this.#token;
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
    if (o.platform !== undefined) u.searchParams.set("platform", o.platform);
    return u.toString();
  }

  // lost handles the end of the open socket.
  #lost(code, reason) {
    const wasOpen = this.#hello !== null;
    const lived = wasOpen ? Date.now() - this.#helloAt : 0;
    this.#dropSocket();
    if (this.#closed || this.#suspended) return;
    if (this.#final(code, reason)) {
      // Coming back as is would be refused again (a client bug, abuse, a
      // token that expired): the client ends, and says why.
      const why = reason ? `${code} (${reason})` : String(code);
      this.#emit("error", Object.freeze({
        code: "refused",
        message: `greendot: the gateway closed the connection with ${why}; not reconnecting`,
        close_code: code,
        reason: String(reason ?? ""),
      }));
      this.#shutdown({ code, reason });
      return;
    }
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

  // final reports whether a close code says not to come back as is: 1002,
  // 1003, 1007 and 1009 (a client bug) and 1008 (kicked, abusive, or the
  // token expired), except 1008 "token expired" when a token function can
  // give a fresh token.
  #final(code, reason) {
    if (!FINAL_CLOSE_CODES.has(code)) return false;
    return !(code === 1008 && reason === "token expired" && this.#tokenFn !== undefined);
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
    // Requests belong to the socket: the next one subscribes and joins
    // again (#opened).
    this.#backlog = [];
    this.#sent = [];
    this.#pending.clear();
    this.#tokens = REQUEST_BURST;
    this.#retryAt = 0;
    this.#refusals = 0;
    if (this.#flushTimer !== null) {
      clearTimeout(this.#flushTimer);
      this.#flushTimer = null;
    }
    for (const link of this.#rooms.values()) link.lost();
  }

  // --- requests (see the comment at REQUEST_WINDOW) ---

  // request queues a request for the open connection, after those before
  // it, and sends what may go now. It reports whether the connection is
  // open to take it.
  #request(msg) {
    if (this.#ws === null || this.#hello === null) return false;
    this.#backlog.push(msg);
    this.#flush();
    return true;
  }

  // inFlight counts the requests that may still wait at the gateway, and
  // returns when the first of those counted for SETTLE_MS stops counting
  // (0 if none).
  #inFlight(now) {
    let n = 0;
    let settles = 0;
    let behind = false;
    for (const w of this.#sent) {
      behind ||= ANSWERED.has(w.msg.type);
      if (behind) {
        n++;
      } else if (now - w.at < SETTLE_MS) {
        n++;
        if (settles === 0) settles = w.at + SETTLE_MS;
      }
    }
    return [n, settles];
  }

  // flush sends the backlog in order while the requests waiting at the
  // gateway, the rate and a refusal's backoff leave room. When time will
  // make room, a timer flushes again; an answer does too (#handled).
  #flush() {
    const now = Date.now();
    this.#tokens = Math.min(REQUEST_BURST, this.#tokens + ((now - this.#refilled) / 1000) * REQUEST_RATE);
    this.#refilled = now;
    // Requests with no answered one ahead, sent long ago, are forgotten: a
    // refusal of them would have come.
    while (this.#sent.length > 0 && !ANSWERED.has(this.#sent[0].msg.type) && now - this.#sent[0].at >= FORGET_AFTER_MS) {
      this.#sent.shift();
    }
    while (this.#backlog.length > 0 && this.#hello !== null) {
      if (now < this.#retryAt) {
        this.#wake(this.#retryAt - now);
        return;
      }
      const [n, settles] = this.#inFlight(now);
      if (n >= REQUEST_WINDOW) {
        if (settles !== 0) this.#wake(settles - now);
        return;
      }
      if (this.#tokens < 1) {
        this.#wake(Math.ceil(((1 - this.#tokens) / REQUEST_RATE) * 1000));
        return;
      }
      const msg = this.#backlog[0];
      if (!this.#send(msg)) return; // the socket is closing: its end clears the backlog
      this.#backlog.shift();
      this.#tokens--;
      this.#sent.push({ msg, at: now });
    }
  }

  // wake flushes the backlog again after ms, unless a flush is already
  // due: that one looks again at what holds the backlog.
  #wake(ms) {
    if (this.#flushTimer !== null) return;
    this.#flushTimer = setTimeout(() => {
      this.#flushTimer = null;
      this.#flush();
    }, Math.max(ms, 1));
  }

  // sentIndex returns the index in #sent of the request with this id; -1
  // for none.
  #sentIndex(id) {
    if (id === undefined || id === null) return -1;
    return this.#sent.findIndex((w) => w.msg.id === id);
  }

  // handled takes the gateway's answer to the request with this id, and
  // lets the backlog go on. An answer sent where the gateway handles the
  // request in order (inOrder: presence_init, denied, room_state) says
  // that the requests sent before it were handled too; one sent as the
  // gateway read the request (an error, room_denied) says nothing of them.
  // It returns the request; undefined when id is none waiting.
  #handled(id, inOrder) {
    const i = this.#sentIndex(id);
    if (i < 0) return undefined;
    const { msg } = this.#sent[i];
    if (inOrder) {
      this.#sent.splice(0, i + 1);
      this.#refusals = 0;
    } else {
      this.#sent.splice(i, 1);
    }
    this.#flush();
    return msg;
  }

  // refused takes the refusal of the request with this id (rate_limited,
  // or unavailable for a subscribe or join): nothing of it happened at the
  // gateway, so what it was for is sent again after a backoff, ahead of
  // the backlog. It reports false when id is none waiting.
  #refused(id) {
    const i = this.#sentIndex(id);
    if (i < 0) return false;
    const again = this.#againAt(i);
    this.#sent.splice(i, 1);
    this.#backlog = [...again, ...this.#backlog];
    this.#hold();
    this.#flush();
    return true;
  }

  // dropped takes an error rate_limited without an id: the gateway's
  // message rate limit dropped a message as it read it, and which one
  // cannot be told. Any request waiting may be it, and an answered one
  // would then never be answered, holding the window for good: each is
  // sent again, as the client wants it now, after a backoff. Sending one
  // twice is harmless; the gateway answers a subscribe or join again.
  #dropped() {
    const again = [];
    for (let i = 0; i < this.#sent.length; i++) again.push(...this.#againAt(i));
    this.#sent = [];
    this.#backlog = [...again, ...this.#backlog];
    this.#hold();
    this.#flush();
  }

  // hold holds the backlog for the backoff of one more refusal; a refusal
  // long after the last backoff ended starts anew.
  #hold() {
    const now = Date.now();
    if (now - this.#retryAt > RETRY_MAX_MS) this.#refusals = 0;
    this.#refusals++;
    this.#retryAt = now + Math.min(RETRY_MAX_MS, RETRY_BASE_MS * 2 ** Math.min(this.#refusals - 1, 16));
  }

  // againAt returns what sends the waiting request at index i again,
  // given the requests that go to the gateway after it.
  #againAt(i) {
    const later = [...this.#sent.slice(i + 1).map((w) => w.msg), ...this.#backlog];
    return this.#again(this.#sent[i].msg, later);
  }

  // again returns what sends the refused request msg again, as the client
  // wants it now, given the requests that go to the gateway after it
  // (later); nothing when a later request already says something about the
  // same room (that one decides, and is sent again itself if refused) or
  // the client no longer wants it (a room left since, a user unwatched).
  // So a leave refused and then a join of the same room end joined, and a
  // join refused and then a leave end left, as the calls asked.
  #again(msg, later) {
    switch (msg.type) {
      case "join":
      case "room_update":
      case "leave": {
        // A later join or leave decides the membership; a later
        // room_update carries a newer meta, but joins nobody.
        if (later.some((l) => l.room === msg.room && (l.type === "join" || l.type === "leave" || l.type === msg.type))) return [];
        const link = this.#rooms.get(msg.room);
        if (msg.type === "leave") return link ? [] : [{ type: "leave", id: this.#nextId("r"), room: msg.room }];
        return link ? [link.again(msg.type)] : [];
      }
      case "subscribe": {
        // The users still watched; the calls waiting for them wait for
        // the new message's answer.
        const calls = this.#pending.get(msg.id) ?? [];
        this.#pending.delete(msg.id);
        const ids = msg.user_ids.filter((u) => this.#wanted.has(u));
        for (const req of calls) {
          for (const u of msg.user_ids) if (!this.#wanted.has(u)) req.remaining.delete(u);
          this.#settle(req);
        }
        if (ids.length === 0) return [];
        const again = { type: "subscribe", id: this.#nextId(), user_ids: ids };
        const waiting = calls.filter((req) => !req.done);
        if (waiting.length > 0) this.#pending.set(again.id, waiting);
        return [again];
      }
      case "unsubscribe": {
        const ids = msg.user_ids.filter((u) => !this.#wanted.has(u));
        return ids.length === 0 ? [] : [{ type: "unsubscribe", id: this.#nextId(), user_ids: ids }];
      }
    }
    return [];
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
      case "presence_init": {
        const users = Array.isArray(m.users) ? m.users : [];
        for (const p of users) this.#update(p);
        this.#handled(m.id, true);
        this.#answered(m.id, (req) => {
          for (const p of users) {
            if (p !== null && typeof p === "object" && req.remaining.delete(p.user_id)) req.users.push(p);
          }
        });
        break;
      }
      case "presence_batch":
        for (const p of Array.isArray(m.updates) ? m.updates : []) this.#update(p);
        break;
      case "self":
        this.#selfFrame(m);
        break;
      case "denied":
        this.#handled(m.id, true);
        this.#denied(m);
        break;
      case "room_state":
      case "room_denied":
        // room_state answers a join in order; room_denied as the gateway
        // read it.
        this.#handled(m.id, m.type === "room_state");
        if (typeof m.room === "string") this.#rooms.get(m.room)?.frame(m);
        break;
      case "room_diff":
      case "room_signal":
        if (typeof m.room === "string") this.#rooms.get(m.room)?.frame(m);
        break;
      case "error": {
        const err = Object.freeze({ code: String(m.code ?? ""), message: String(m.message ?? ""), id: m.id });
        if (m.id === undefined || m.id === null) {
          // The message rate limit dropped a message: maybe a request.
          if (err.code === "rate_limited") this.#dropped();
        } else {
          const i = this.#sentIndex(m.id);
          const type = i < 0 ? undefined : this.#sent[i].msg.type;
          if (err.code === "rate_limited" || (err.code === "unavailable" && ANSWERED.has(type))) {
            // Nothing happened: sent again shortly, as wanted then.
            this.#refused(m.id);
          } else {
            this.#handled(m.id, false);
            const calls = this.#pending.get(m.id);
            this.#pending.delete(m.id);
            for (const req of calls ?? []) {
              if (req.done) continue;
              req.done = true;
              this.#calls.delete(req);
              req.reject(Object.assign(new Error(`greendot: ${err.code}: ${err.message}`), { code: err.code }));
            }
          }
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
    if (this.#background) this.#send(this.#background);
    else if (this.#idleSent) this.#send({ type: "idle" });
    else this.#activity.reset();
  }

  // resubscribe asks again for every watched user: first those of the
  // subscribe calls still waiting for an answer, then the rest, in messages
  // of at most MAX_SUBSCRIBE_IDS ids.
  #resubscribe() {
    this.#pending.clear();
    const asked = new Set();
    for (const req of [...this.#calls]) {
      for (const u of [...req.remaining]) {
        if (!this.#wanted.has(u)) req.remaining.delete(u);
        else asked.add(u);
      }
      this.#settle(req);
    }
    const ids = [...asked, ...[...this.#wanted].filter((u) => !asked.has(u))];
    for (const chunk of subscribeChunks(ids)) {
      const id = this.#nextId();
      const inChunk = new Set(chunk);
      const calls = [...this.#calls].filter((req) => [...req.remaining].some((u) => inChunk.has(u)));
      if (calls.length > 0) this.#pending.set(id, calls);
      this.#request({ type: "subscribe", id, user_ids: chunk });
    }
  }

  #nextId(prefix = "s") {
    this.#seq++;
    return `${prefix}-${this.#seq}`;
  }

  // answered applies part of an answer to the subscribe message with this
  // id to each call it answers, and resolves those now answered in full.
  #answered(id, apply) {
    if (id === undefined || id === null) return;
    const calls = this.#pending.get(id);
    if (!calls) return;
    for (const req of calls) {
      if (req.done) continue;
      apply(req);
      this.#settle(req);
    }
    if (calls.every((req) => req.done)) this.#pending.delete(id);
  }

  // settle resolves a subscribe call once each of its users was answered:
  // in a presence_init, or denied (or no longer watched).
  #settle(req) {
    if (req.done || req.remaining.size > 0) return;
    req.done = true;
    this.#calls.delete(req);
    req.resolve({ users: req.users, denied: req.denied });
  }

  #update(p) {
    if (p === null || typeof p !== "object" || !validUserId(p.user_id) || typeof p.status !== "string") return;
    if (!this.#wanted.has(p.user_id)) return; // unsubscribed meanwhile
    const prev = this.#presence.get(p.user_id);
    const next = Object.freeze({ ...p });
    if (
      prev &&
      prev.status === next.status &&
      prev.last_seen === next.last_seen &&
      samePlatforms(prev.platforms, next.platforms) &&
      sameCustom(prev.custom_status, next.custom_status)
    )
      return;
    this.#presence.set(p.user_id, next);
    this.#emit("change", p.user_id, next);
  }

  #selfFrame(m) {
    const next = { status: m.status, devices: Number(m.devices) || 0 };
    if (m.custom_status && typeof m.custom_status === "object") next.custom_status = Object.freeze({ ...m.custom_status });
    Object.freeze(next);
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
    if (!prev || prev.status !== next.status || prev.devices !== next.devices || !sameCustom(prev.custom_status, next.custom_status)) {
      this.#emit("self", next);
    }
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
      this.#background = null;
      this.connect();
      return;
    }
    this.#active();
  }

  #hidden() {
    this.#clearHidden();
    if (this.#opts.backgroundOnHide) {
      // A phone's app switched away from: in the background at once, so
      // that the socket the system may kill soon ends in the grace.
      if (!this.#background) this.background();
    } else this.#idleTimer = setTimeout(() => {
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
      // Back from idle (or the background): say so at once.
      this.#idleSent = false;
      this.#background = null;
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
  #ids = new Set(); // ids of the messages of this room sent lately
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
    // again returns a join or room_update of the room as it is now, to send
    // again what the gateway refused.
    link.again = (type) => {
      const msg = { type, id: this.#remember(this.#link.nextId()), room: this.#id };
      if (this.#meta !== undefined) msg.meta = this.#meta;
      return msg;
    };
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
   * later join), and reports whether it goes out on the open connection:
   * at once, or, when the gateway has many requests of this client to
   * handle, as soon as it takes more. Updates that wait are folded into
   * one with the newest meta, and one the gateway refuses (too many at
   * once: rate_limited) is sent again, with the newest meta.
   */
  updateMeta(meta) {
    checkMeta(meta);
    this.#live();
    this.#meta = meta;
    if (!this.#link.open()) return false;
    if (this.#link.update(meta)) return true;
    return this.#link.request({ type: "room_update", id: this.#remember(this.#link.nextId()), room: this.#id, meta });
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
    if (!this.#synced || !this.#link.send({ type: "typing", id: this.#remember(this.#link.nextId()), room: this.#id })) return false;
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
    const msg = { type: "signal", id: this.#remember(this.#link.nextId()), room: this.#id, signal: type };
    if (data !== undefined) msg.data = data;
    return this.#link.send(msg);
  }

  /**
   * leave leaves the room for good; client.room(id) joins it again. A
   * leave the gateway refuses (too many requests at once) is sent again.
   */
  leave() {
    if (this.#state === "left" || this.#state === "denied") return;
    this.#end("left");
    this.#link.request({ type: "leave", id: this.#link.nextId(), room: this.#id });
  }

  #live() {
    if (this.#state === "left" || this.#state === "denied") {
      throw new Error(`greendot: room ${this.#id} was ${this.#state}; join it again with client.room`);
    }
  }

  #remember(id) {
    this.#ids.add(id);
    if (this.#ids.size > 64) this.#ids.delete(this.#ids.values().next().value);
    return id;
  }

  #join() {
    this.#synced = false;
    this.#typingSent = -Infinity;
    const msg = { type: "join", id: this.#remember(this.#link.nextId()), room: this.#id };
    if (this.#meta !== undefined) msg.meta = this.#meta;
    this.#link.request(msg);
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
