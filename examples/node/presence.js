#!/usr/bin/env node
// presence.js: a command-line client of greendot presence, and a worked
// example of the client protocol (docs/protocol.md) outside the browser.
//
//   node presence.js --url ws://127.0.0.1:8080/ws --user alice --status busy bob carol
//
// It connects as one user, sends heartbeats at the interval the gateway asks
// for, watches the users named on the command line, chooses a status, and
// prints every event as one JSON line on stdout, so that another program can
// read it. When the connection drops it reconnects with exponential backoff
// and full jitter, then subscribes again and restores the chosen status. It
// stops, with a message on stderr and a non-zero exit code, when coming back
// could only be refused again: a handshake refused with 400, 401, 403 or
// 404, or one of the close codes that say the client must not come back.
//
// The loop is the same on any stack: connect, read hello, heartbeat every
// heartbeat_interval_ms, subscribe, set the status; on a drop wait (backoff
// with jitter), connect again, and repeat the subscribe and the status.
"use strict";

const { parseArgs } = require("node:util");
const WebSocket = require("ws");

const USAGE = `usage: node presence.js [options] [user_id ...]

Watches the presence of the given users and prints one JSON line per event.

options:
  --url URL             the gateway's WebSocket endpoint (default ws://127.0.0.1:8080/ws)
  --user ID             connect as this user with dev auth (?user=); otherwise the
                        JWT in the environment variable GREENDOT_TOKEN is sent
  --device LABEL        name this device in the user's own view (web, ios, cli, ...)
  --status STATUS       choose a status: online, away, busy or invisible
  --backoff-base-ms N   first reconnect delay cap (default 500)
  --backoff-max-ms N    largest reconnect delay cap (default 30000)
  -h, --help            show this help

exit codes: 0 stopped by SIGINT or SIGTERM, 2 bad command line,
3 refused at the handshake (bad token, bad user id), 4 closed for good by the gateway`;

const EXIT_USAGE = 2;
const EXIT_REFUSED = 3;
const EXIT_CLOSED = 4;

// Protocol limits (docs/protocol.md): ids per subscribe, bytes per message.
const MAX_SUBSCRIBE_IDS = 100;
const MAX_MESSAGE_BYTES = 4096;
const USER_ID = /^[A-Za-z0-9_-]{1,64}$/;
const DEVICE = /^[A-Za-z0-9_. -]{1,32}$/;
const STATUSES = ["online", "away", "busy", "invisible"];

// retryable reports whether a handshake refused with this HTTP status may
// succeed later: 429 (the user has too many connections), 408, and 5xx (the
// gateway is full or draining, or a proxy in front of it failed). Any other
// refusal (400 bad user id or device, 401 bad or expired token, 403 Origin,
// 404 wrong path, 431) would be the same next time.
function retryable(status) {
  return status === 408 || status === 429 || status >= 500;
}

// Close codes after which reconnecting would only repeat the refusal: the
// client broke the protocol, or was kicked, abusive, or its token expired
// (a fresh token needs a fresh start). Every other close (1000, 1001
// draining, 1006 connection lost, 1011, 1012) is followed by a reconnect.
const FINAL_CLOSES = new Map([
  [1002, "protocol error"],
  [1003, "a binary frame was sent"],
  [1007, "a message was not valid UTF-8"],
  [1008, "policy violation: kicked by an operator, abuse beyond rate limits, or an expired token"],
  [1009, "a message over the size limit"],
]);

// After a close with 1001 (the gateway is draining) come back soon, spread
// over this long so that its clients do not all arrive at once elsewhere.
const DRAIN_JITTER_MS = 1000;
// A connection that stayed open this long resets the backoff.
const STABLE_AFTER_MS = 10_000;
const HANDSHAKE_TIMEOUT_MS = 10_000;

// The gateway handles a socket's subscribes in order, and lets 16 of its
// requests wait (set_status included); one more subscribe is refused with
// an error rate_limited that echoes its id. Its message rate limit (20 a
// second, 40 at once, by default) drops a message beyond it, with an error
// rate_limited without id. So at most REQUEST_WINDOW subscribes wait for
// their answer (presence_init), they go at most REQUEST_RATE a second after
// REQUEST_BURST, and one refused for now (rate_limited, or unavailable) is
// sent again after a backoff: RETRY_BASE_MS, doubled per refusal until an
// answer comes, up to RETRY_MAX_MS. A message dropped could be any
// subscribe waiting, so all of those are sent again.
const REQUEST_WINDOW = 8;
const REQUEST_RATE = 10;
const REQUEST_BURST = 20;
const RETRY_BASE_MS = 100;
const RETRY_MAX_MS = 5_000;

function main() {
  const opts = readOptions(process.argv.slice(2));
  const client = new PresenceClient(opts);
  for (const sig of ["SIGINT", "SIGTERM"]) process.on(sig, () => client.stop());
  client.connect();
}

// readOptions parses and checks the command line; on a mistake it prints
// what is wrong and the usage, and exits with 2.
function readOptions(argv) {
  let parsed;
  try {
    parsed = parseArgs({
      args: argv,
      allowPositionals: true,
      options: {
        url: { type: "string", default: "ws://127.0.0.1:8080/ws" },
        user: { type: "string" },
        device: { type: "string" },
        status: { type: "string" },
        "backoff-base-ms": { type: "string", default: "500" },
        "backoff-max-ms": { type: "string", default: "30000" },
        help: { type: "boolean", short: "h" },
      },
    });
  } catch (err) {
    usage(err.message);
  }
  const v = parsed.values;
  if (v.help) {
    console.log(USAGE);
    process.exit(0);
  }
  const token = process.env.GREENDOT_TOKEN;
  if (v.user === undefined && !token) usage("give --user (dev auth) or a JWT in GREENDOT_TOKEN");
  if (v.user !== undefined && token) usage("give --user or GREENDOT_TOKEN, not both");
  if (v.user !== undefined && !USER_ID.test(v.user)) usage(`--user ${JSON.stringify(v.user)}: ${badUserId}`);
  if (v.device !== undefined && !DEVICE.test(v.device)) {
    usage(`--device ${JSON.stringify(v.device)}: 1 to 32 characters of A-Z a-z 0-9 _ - . and space`);
  }
  if (v.status !== undefined && !STATUSES.includes(v.status)) {
    usage(`--status ${JSON.stringify(v.status)}: one of ${STATUSES.join(", ")}`);
  }
  for (const id of parsed.positionals) {
    if (!USER_ID.test(id)) usage(`user id ${JSON.stringify(id)}: ${badUserId}`);
  }
  const base = milliseconds("--backoff-base-ms", v["backoff-base-ms"], 1);
  const max = milliseconds("--backoff-max-ms", v["backoff-max-ms"], base); // at least the base

  let url;
  try {
    url = new URL(v.url);
  } catch {
    usage(`--url ${JSON.stringify(v.url)}: not a URL`);
  }
  if (url.protocol === "http:") url.protocol = "ws:";
  if (url.protocol === "https:") url.protocol = "wss:";
  if (url.protocol !== "ws:" && url.protocol !== "wss:") usage(`--url ${v.url}: the scheme must be ws, wss, http or https`);
  if (url.pathname === "/") url.pathname = "/ws";
  if (v.user !== undefined) url.searchParams.set("user", v.user);
  if (v.device !== undefined) url.searchParams.set("device", v.device);

  return {
    url: url.toString(),
    // A token goes in the Authorization header: unlike ?token=, it stays
    // out of proxy logs. (Browsers cannot set headers; Node can.)
    headers: token ? { Authorization: `Bearer ${token}` } : {},
    status: v.status,
    watch: [...new Set(parsed.positionals)],
    backoffBaseMs: base,
    backoffMaxMs: max,
  };
}

const badUserId = "user ids are 1 to 64 characters of A-Z a-z 0-9 _ -";

function milliseconds(name, s, min) {
  const n = Number(s);
  if (!/^\d+$/.test(s) || n < min) usage(`${name} ${JSON.stringify(s)}: a whole number of milliseconds, at least ${min}`);
  return n;
}

function usage(problem) {
  console.error(`presence.js: ${problem} (--help shows the usage)`);
  process.exit(EXIT_USAGE);
}

// emit prints one event as one line of JSON on stdout.
function emit(event, fields) {
  process.stdout.write(JSON.stringify({ event, ...fields }) + "\n");
}

// backoffDelay is "full jitter": a random delay from 0 up to
// min(max, base * 2^attempt), so that many clients cut off at once do not
// all come back at the same moment.
function backoffDelay(attempt, baseMs, maxMs) {
  const cap = Math.min(maxMs, baseMs * 2 ** Math.min(attempt, 30));
  return Math.floor(Math.random() * cap);
}

// subscribeChunks splits ids into subscribe messages the gateway takes: at
// most 100 ids and 4 KiB each (user ids are ASCII, so characters are bytes).
function subscribeChunks(ids) {
  const chunks = [];
  let chunk = [];
  for (const id of ids) {
    const next = [...chunk, id];
    if (chunk.length === MAX_SUBSCRIBE_IDS || JSON.stringify(subscribeMessage("s-999999", next)).length > MAX_MESSAGE_BYTES) {
      chunks.push(chunk);
      chunk = [id];
    } else {
      chunk = next;
    }
  }
  if (chunk.length > 0) chunks.push(chunk);
  return chunks;
}

function subscribeMessage(id, userIds) {
  return { type: "subscribe", id, user_ids: userIds };
}

class PresenceClient {
  constructor(opts) {
    this.opts = opts;
    this.wanted = new Set(opts.watch); // users to watch, again after every reconnect
    this.chosen = opts.status; // the status to restore after every reconnect
    this.confirming = null; // a status this client sent that no self frame confirmed yet
    this.ws = null;
    this.attempt = 0;
    this.retryTimer = null;
    this.stopping = false;
    this.seq = 0;
  }

  connect() {
    const ws = new WebSocket(this.opts.url, { headers: this.opts.headers, handshakeTimeout: HANDSHAKE_TIMEOUT_MS });
    this.ws = ws;
    const conn = {
      ws,
      hello: null,
      openedAt: 0,
      refusal: null,
      error: "",
      heartbeat: null,
      helloTimer: null,
      lastPong: 0,
      // The subscribes of this connection (see REQUEST_WINDOW): backlog,
      // the lists of user ids still to send; sent, those sent and not
      // answered yet, by id, in the order sent; the rate's tokens as of
      // refilled; a refusal's backoff until retryAt.
      backlog: [],
      sent: new Map(),
      tokens: REQUEST_BURST,
      refilled: 0,
      retryAt: 0,
      refusals: 0,
      flushTimer: null,
    };

    // The gateway answers a refused upgrade with a plain HTTP status and a
    // line of text saying why; read it before deciding whether to retry.
    ws.on("unexpected-response", (req, res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (chunk) => {
        if (body.length < 1024) body += chunk;
      });
      const done = () => {
        if (conn.refusal) return;
        conn.refusal = { status: res.statusCode, body: body.trim().slice(0, 1024) };
        ws.terminate();
      };
      res.on("end", done);
      res.on("error", done);
    });
    // The gateway sends hello as soon as it accepted the upgrade: wait for
    // it no longer than for the handshake (a dead path closes nothing).
    ws.on("upgrade", () => {
      conn.helloTimer = setTimeout(() => {
        conn.error = `no hello from the gateway within ${HANDSHAKE_TIMEOUT_MS} ms`;
        ws.terminate();
      }, HANDSHAKE_TIMEOUT_MS);
    });
    ws.on("message", (data, isBinary) => {
      if (!isBinary) this.frame(conn, data.toString());
    });
    ws.on("pong", () => {
      conn.lastPong = Date.now();
    });
    ws.on("error", (err) => {
      conn.error = err.message; // a close event follows
    });
    ws.on("close", (code, reason) => this.closed(conn, code, reason.toString()));
  }

  // frame handles one message from the gateway.
  frame(conn, text) {
    let m;
    try {
      m = JSON.parse(text);
    } catch {
      emit("error", { code: "bad_frame", message: "the gateway sent a frame that is not JSON" });
      return;
    }
    switch (m.type) {
      case "hello":
        this.opened(conn, m);
        break;
      case "presence_init": // the answer to subscribe: the current state of each user
        for (const p of m.users ?? []) this.presence(p, true);
        this.answered(conn, m.id);
        break;
      case "presence_batch": // changes of watched users
        for (const p of m.updates ?? []) this.presence(p, false);
        break;
      case "self": // this user's own true status, and live device count
        // Another device chose a status: adopt it, so that a reconnect of
        // this one does not undo that choice. Not adopted: the self frames
        // before the one confirming this client's own set_status (they
        // show the status before it), and away, which may be automatic.
        if (this.confirming !== null) {
          if (m.status === this.confirming) this.confirming = null;
        } else if (this.chosen !== undefined && STATUSES.includes(m.status) && m.status !== "away") {
          this.chosen = m.status;
        }
        emit("self", { status: m.status, devices: m.devices });
        break;
      case "denied": // a subscription refused, or ended later
        this.wanted.delete(m.user_id);
        emit("denied", { user_id: m.user_id, reason: m.reason });
        break;
      case "error":
        if (m.code === "rate_limited" && (m.id === undefined || m.id === null)) {
          this.dropped(conn);
        } else if (conn.sent.has(m.id)) {
          // The subscribe with this id: refused for now, or for good.
          if (m.code === "rate_limited" || m.code === "unavailable") this.refused(conn, m.id);
          else conn.sent.delete(m.id);
          this.flush(conn);
        }
        emit("error", { code: m.code, message: m.message });
        break;
      default:
      // A message type from a newer gateway: ignore it.
    }
  }

  // opened runs the start of every connection: heartbeats, the chosen
  // status, and the subscriptions.
  opened(conn, hello) {
    clearTimeout(conn.helloTimer);
    conn.hello = hello;
    conn.openedAt = Date.now();
    conn.lastPong = conn.openedAt;
    emit("connected", {
      user_id: hello.user_id,
      conn_id: hello.conn_id,
      status: hello.status,
      heartbeat_interval_ms: hello.heartbeat_interval_ms,
      ttl_ms: hello.ttl_ms,
    });

    // The gateway ends a connection silent for ttl_ms: send a heartbeat
    // every heartbeat_interval_ms. A WebSocket ping goes with it, and a
    // gateway that answered no ping for ttl_ms and one more interval is
    // gone (a dead network path closes nothing by itself): drop the socket
    // and reconnect.
    const every = Math.max(Number(hello.heartbeat_interval_ms) || 15_000, 100);
    const ttl = Math.max(Number(hello.ttl_ms) || 2 * every, every);
    conn.heartbeat = setInterval(() => {
      if (Date.now() - conn.lastPong > ttl + every) {
        conn.error = `no answer from the gateway for ${Date.now() - conn.lastPong} ms`;
        conn.ws.terminate();
        return;
      }
      if (conn.ws.readyState !== WebSocket.OPEN) return;
      this.send(conn, { type: "heartbeat" });
      conn.ws.ping();
    }, every);

    this.confirming = null;
    if (this.chosen !== undefined && this.chosen !== hello.status) {
      this.confirming = this.chosen;
      this.send(conn, { type: "set_status", status: this.chosen });
    }
    conn.backlog = subscribeChunks(this.wanted);
    conn.refilled = Date.now();
    this.flush(conn);
  }

  // flush sends the subscribes of the backlog while the window, the rate
  // and a refusal's backoff leave room; when time will make room, a timer
  // flushes again, and so does an answer.
  flush(conn) {
    const now = Date.now();
    conn.tokens = Math.min(REQUEST_BURST, conn.tokens + ((now - conn.refilled) / 1000) * REQUEST_RATE);
    conn.refilled = now;
    while (conn.backlog.length > 0 && conn.ws.readyState === WebSocket.OPEN && conn.sent.size < REQUEST_WINDOW) {
      const wait = Math.max(conn.retryAt - now, conn.tokens < 1 ? ((1 - conn.tokens) / REQUEST_RATE) * 1000 : 0);
      if (wait > 0) {
        if (conn.flushTimer === null) {
          conn.flushTimer = setTimeout(() => {
            conn.flushTimer = null;
            this.flush(conn);
          }, Math.ceil(wait));
        }
        return;
      }
      const ids = conn.backlog.shift().filter((id) => this.wanted.has(id));
      if (ids.length === 0) continue;
      const id = `s-${++this.seq}`;
      conn.tokens--;
      conn.sent.set(id, ids);
      this.send(conn, subscribeMessage(id, ids));
    }
  }

  // answered takes the presence_init of the subscribe with this id: the
  // gateway handles them in order, so the ones sent before it were
  // handled too.
  answered(conn, id) {
    if (!conn.sent.has(id)) return;
    for (const sentId of conn.sent.keys()) {
      conn.sent.delete(sentId);
      if (sentId === id) break;
    }
    conn.refusals = 0;
    this.flush(conn);
  }

  // refused puts the subscribe with this id, which the gateway refused for
  // now, back ahead of the backlog, and holds the backlog for a backoff.
  refused(conn, id) {
    conn.backlog.unshift(conn.sent.get(id));
    conn.sent.delete(id);
    this.hold(conn);
  }

  // dropped takes an error rate_limited without an id: the message rate
  // limit dropped a message, maybe a subscribe waiting, which would then
  // never be answered. Each is sent again after a backoff; a subscribe
  // answered twice is harmless.
  dropped(conn) {
    conn.backlog.unshift(...conn.sent.values());
    conn.sent.clear();
    this.hold(conn);
    this.flush(conn);
  }

  // hold holds the backlog for the backoff of one more refusal; a refusal
  // long after the last backoff ended starts anew.
  hold(conn) {
    const now = Date.now();
    if (now - conn.retryAt > RETRY_MAX_MS) conn.refusals = 0;
    conn.refusals++;
    conn.retryAt = now + Math.min(RETRY_MAX_MS, RETRY_BASE_MS * 2 ** Math.min(conn.refusals - 1, 16));
  }

  presence(p, snapshot) {
    if (p === null || typeof p !== "object" || !this.wanted.has(p.user_id)) return;
    const line = { user_id: p.user_id, status: p.status };
    if (p.last_seen !== undefined) line.last_seen = p.last_seen;
    line.snapshot = snapshot;
    emit("presence", line);
  }

  send(conn, msg) {
    if (conn.ws.readyState === WebSocket.OPEN) conn.ws.send(JSON.stringify(msg));
  }

  // closed decides what follows the end of a connection: nothing (stopping),
  // an exit (a permanent refusal), or a reconnect after a delay.
  closed(conn, code, reason) {
    clearInterval(conn.heartbeat);
    clearTimeout(conn.helloTimer);
    clearTimeout(conn.flushTimer);
    if (this.stopping) return process.exit(0);

    if (conn.refusal) {
      const { status, body } = conn.refusal;
      if (!retryable(status)) {
        return this.fail(EXIT_REFUSED, `the gateway refused the connection: HTTP ${status}${body ? `: ${body}` : ""}; not reconnecting`);
      }
      this.retry({ http_status: status, reason: body });
      return;
    }
    if (FINAL_CLOSES.has(code)) {
      const why = reason ? `: ${reason}` : "";
      return this.fail(EXIT_CLOSED, `the gateway closed the connection with ${code} (${FINAL_CLOSES.get(code)})${why}; not reconnecting`);
    }
    if (conn.hello && Date.now() - conn.openedAt >= STABLE_AFTER_MS) this.attempt = 0;
    this.retry({ close_code: code, reason: reason || conn.error });
  }

  retry(detail) {
    let delay;
    if (detail.close_code === 1001) {
      // The gateway is draining: come back soon, with jitter.
      this.attempt = 0;
      delay = Math.floor(Math.random() * DRAIN_JITTER_MS);
    } else {
      delay = backoffDelay(this.attempt, this.opts.backoffBaseMs, this.opts.backoffMaxMs);
      this.attempt++;
    }
    emit("disconnected", { ...detail, retry_in_ms: delay, attempt: this.attempt });
    this.retryTimer = setTimeout(() => {
      this.retryTimer = null;
      this.connect();
    }, delay);
  }

  fail(exitCode, message) {
    console.error(`presence.js: ${message}`);
    process.exit(exitCode);
  }

  // stop closes the connection cleanly (watchers see this user offline
  // after the gateway's short grace period) and exits with 0.
  stop() {
    if (this.stopping) return;
    this.stopping = true;
    const ws = this.ws;
    if (ws === null || this.retryTimer !== null || ws.readyState === WebSocket.CLOSED) process.exit(0); // not connected: nothing to close
    ws.close(1000, "client stopped");
    // Do not wait forever for the gateway's answer to the close.
    setTimeout(() => process.exit(0), 2000).unref();
  }
}

main();
