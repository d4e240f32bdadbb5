// Unit tests of greendot.js, run inside a real browser page by
// TestClientInBrowser (browser_test.go): the Go test evaluates this
// expression, calls it with the module and the names of a mutual pair of
// users, and reports each failure. Timers are real, so every wait is
// bounded and every bound generous.
async (m, users) => {
  const failures = [];
  let passed = 0;
  const check = (name, ok, detail) => {
    if (ok) passed++;
    else failures.push(detail === undefined ? name : `${name}: ${detail}`);
  };
  const throws = (name, fn, type = TypeError) => {
    try {
      fn();
      failures.push(`${name}: did not throw`);
    } catch (err) {
      check(name, err instanceof type, `threw ${err}`);
    }
  };
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  const until = async (name, fn, ms = 3000) => {
    const end = Date.now() + ms;
    while (Date.now() < end) {
      if (fn()) return true;
      await sleep(5);
    }
    failures.push(`${name}: not true after ${ms} ms`);
    return false;
  };
  const json = (v) => JSON.stringify(v);

  // A WebSocket stand-in that records what the client sends and lets the
  // test play the server.
  const fakeWebSocket = () => {
    class FakeWS {
      static all = [];
      constructor(url) {
        this.url = url;
        this.readyState = 0;
        this.sent = [];
        this.onmessage = this.onclose = this.onerror = null;
        FakeWS.all.push(this);
      }
      send(data) {
        if (this.readyState !== 1) throw new Error("send on a socket that is not open");
        this.sent.push(JSON.parse(data));
      }
      close(code, reason) {
        this.closedWith = { code, reason };
        this.readyState = 3;
      }
      open(hello = {}) {
        this.readyState = 1;
        this.deliver({ type: "hello", user_id: "me", conn_id: `c${FakeWS.all.length}`, heartbeat_interval_ms: 60000, ttl_ms: 120000, status: "online", ...hello });
      }
      deliver(msg) {
        if (this.onmessage) this.onmessage({ data: JSON.stringify(msg) });
      }
      drop(code, reason = "") {
        this.readyState = 3;
        if (this.onclose) this.onclose({ code, reason });
      }
      of(type) {
        return this.sent.filter((s) => s.type === type);
      }
      get last() {
        return FakeWS.all[FakeWS.all.length - 1];
      }
    }
    return FakeWS;
  };
  const quiet = { trackVisibility: false, backoffBaseMs: 20, backoffMaxMs: 100, drainJitterMs: 50 };

  // --- backoffDelay: full jitter under the cap ---
  {
    let worst = 0;
    for (let a = 0; a <= 60; a++) {
      const hi = m.backoffDelay(a, 500, 30000, () => 0.999999);
      const cap = Math.min(30000, 500 * 2 ** a);
      if (hi > cap || hi < 0) worst++;
      if (m.backoffDelay(a, 500, 30000, () => 0) !== 0) worst++;
    }
    check("backoffDelay stays within [0, min(max, base*2^attempt)]", worst === 0, `${worst} out of bounds`);
    check("backoffDelay grows: attempt 3 can reach 4000", m.backoffDelay(3, 500, 30000, () => 0.999999) >= 3990);
    check("backoffDelay is capped: attempt 20 stays under 30000", m.backoffDelay(20, 500, 30000, () => 0.999999) < 30000);
    check("backoffDelay of a negative attempt is the first one", m.backoffDelay(-5, 500, 30000, () => 0.999999) < 500);
    const samples = Array.from({ length: 4000 }, () => m.backoffDelay(4, 100, 30000));
    const mean = samples.reduce((a, b) => a + b, 0) / samples.length;
    check("backoffDelay samples lie in [0, 1600)", samples.every((s) => s >= 0 && s < 1600));
    check("backoffDelay is spread out (full jitter)", new Set(samples).size > 500, `${new Set(samples).size} distinct values`);
    check("backoffDelay averages half the cap", Math.abs(mean - 800) < 80, `mean ${mean}`);
  }

  // --- Throttle: at once, then at most once per window, trailing call kept ---
  {
    const clock = {
      t: 0,
      timers: [],
      now() { return this.t; },
      setTimeout(fn, ms) { const id = { fn, at: this.t + ms }; this.timers.push(id); return id; },
      clearTimeout(id) { this.timers = this.timers.filter((x) => x !== id); },
      advance(to) {
        this.t = to;
        for (const x of this.timers.filter((x) => x.at <= to)) {
          this.timers = this.timers.filter((y) => y !== x);
          x.fn();
        }
      },
    };
    const calls = [];
    const th = new m.Throttle(() => calls.push(clock.t), 30000, clock);
    th.call();
    check("Throttle: first call runs at once", json(calls) === "[0]", json(calls));
    clock.t = 10; th.call();
    clock.t = 20; th.call();
    check("Throttle: calls inside the window wait", calls.length === 1 && th.pending && clock.timers.length === 1, json(calls));
    clock.advance(29999);
    check("Throttle: nothing before the window ends", calls.length === 1);
    clock.advance(30000);
    check("Throttle: one folded call at the end of the window", json(calls) === "[0,30000]", json(calls));
    clock.t = 30001; th.call();
    th.cancel();
    clock.advance(90000);
    check("Throttle: cancel drops the folded call", calls.length === 2 && !th.pending, json(calls));
    clock.t = 90001; th.call();
    check("Throttle: a call after a quiet window runs at once", json(calls) === "[0,30000,90001]", json(calls));
    clock.t = 90002; th.reset(); th.call();
    check("Throttle: reset lets the next call run at once", calls.length === 4);
    throws("Throttle rejects a negative interval", () => new m.Throttle(() => {}, -1));
  }

  // --- subscribeChunks: at most 100 ids and 4 KiB per message ---
  {
    const short = Array.from({ length: 250 }, (_, i) => `u${i}`);
    const c1 = m.subscribeChunks(short);
    check("subscribeChunks: 250 ids in 100/100/50", json(c1.map((c) => c.length)) === "[100,100,50]", json(c1.map((c) => c.length)));
    const long = Array.from({ length: 150 }, (_, i) => `${"x".repeat(58)}${String(i).padStart(6, "0")}`);
    const c2 = m.subscribeChunks(long);
    const sizes = c2.map((c) => JSON.stringify({ type: "subscribe", id: "s-999999", user_ids: c }).length);
    check("subscribeChunks: long ids stay under 4 KiB", sizes.every((s) => s <= m.MAX_MESSAGE_BYTES), json(sizes));
    check("subscribeChunks: keeps every id in order", json(c2.flat()) === json(long));
    check("subscribeChunks: nothing for no ids", m.subscribeChunks([]).length === 0);
  }

  // --- options and arguments are checked ---
  {
    const W = fakeWebSocket();
    throws("GreenDot needs a token or a user", () => new m.GreenDot({ WebSocket: W, connect: false }));
    throws("GreenDot rejects a session that is not a boolean", () => new m.GreenDot({ session: "yes", WebSocket: W, connect: false }));
    throws("GreenDot needs a token or a user when session is false", () => new m.GreenDot({ session: false, WebSocket: W, connect: false }));
    throws("GreenDot rejects an empty token", () => new m.GreenDot({ token: "", WebSocket: W, connect: false }));
    throws("GreenDot rejects a bad user id", () => new m.GreenDot({ user: "a.b", WebSocket: W, connect: false }));
    throws("GreenDot rejects a bad device", () => new m.GreenDot({ user: "a", device: "x/y", WebSocket: W, connect: false }));
    throws("GreenDot rejects a bad status", () => new m.GreenDot({ user: "a", status: "offline", WebSocket: W, connect: false }));
    throws("GreenDot rejects a negative threshold", () => new m.GreenDot({ user: "a", idleAfterMs: -1, WebSocket: W, connect: false }));
    throws("GreenDot rejects a cap under the base", () => new m.GreenDot({ user: "a", backoffBaseMs: 100, backoffMaxMs: 10, WebSocket: W, connect: false }));
    throws("GreenDot rejects an ftp url", () => new m.GreenDot({ user: "a", url: "ftp://x/", WebSocket: W, connect: false }));
    const gd = new m.GreenDot({ user: "a", WebSocket: W, connect: false, trackVisibility: false });
    check("a client made with connect: false is new", gd.state === "new" && W.all.length === 0);
    throws("setStatus rejects offline", () => gd.setStatus("offline"));
    throws("subscribe rejects a bad id", () => gd.subscribe(["ok", "not ok"]));
    throws("subscribe rejects a number", () => gd.subscribe(42));
    throws("on rejects an unknown event", () => gd.on("presence", () => {}));
    throws("send rejects a message without a type", () => gd.send({ id: "x" }));
    gd.close();
  }

  // --- urls ---
  {
    const W = fakeWebSocket();
    const make = async (o) => {
      const n = W.all.length;
      const gd = new m.GreenDot({ WebSocket: W, ...quiet, ...o });
      check("url: no socket before the constructor returns", W.all.length === n);
      await until("url: a socket", () => W.all.length === n + 1);
      gd.close();
    };
    await make({ user: "alice", device: "web", url: "http://h.example:8080" });
    check("url: http becomes ws, /ws added, user and device set", W.all[0]?.url === "ws://h.example:8080/ws?user=alice&device=web", W.all[0]?.url);
    await make({ user: "alice" });
    check("url: defaults to /ws on the page's host", W.all[1]?.url === `ws://${location.host}/ws?user=alice`, W.all[1]?.url);
    await make({ token: "t.o.k", user: "ignored", url: "https://h.example/presence/ws" });
    check("url: https becomes wss, token wins over user", W.all[2]?.url === "wss://h.example/presence/ws?token=t.o.k", W.all[2]?.url);
    let calls = 0;
    const gd = new m.GreenDot({ WebSocket: W, ...quiet, token: async () => `tok${++calls}`, url: "ws://h.example" });
    await until("url: a token function is awaited", () => W.all.length === 4);
    check("url: the token function's token is used", W.all[3]?.url === "ws://h.example/ws?token=tok1", W.all[3]?.url);
    W.all[3].drop(1006);
    await until("url: the token function is called again on reconnect", () => W.all.length === 5);
    check("url: a fresh token for the reconnect", W.all[4]?.url === "ws://h.example/ws?token=tok2", W.all[4]?.url);
    gd.close();
    await make({ session: true, platform: "web", url: "https://h.example" });
    check("url: session sends neither token nor user", W.all[5]?.url === "wss://h.example/ws?platform=web", W.all[5]?.url);
  }

  // --- a failing token function is reported and retried ---
  {
    const W = fakeWebSocket();
    const errors = [];
    let n = 0;
    const gd = new m.GreenDot({
      WebSocket: W, ...quiet, url: "ws://h.example",
      token: () => {
        if (++n < 3) throw new Error("no session");
        return "good";
      },
    });
    gd.onError((e) => errors.push(e.code));
    await until("token: retried until it works", () => W.all.length === 1);
    check("token: each failure is an error event", errors.length === 2 && errors.every((c) => c === "token_failed"), json(errors));
    gd.close();
  }

  // --- subscribe and status before the connection opens, then the answer ---
  {
    const W = fakeWebSocket();
    const gd = new m.GreenDot({ user: "me", WebSocket: W, ...quiet, url: "ws://h.example" });
    const changes = [];
    const denials = [];
    const states = [];
    gd.onChange((id, p) => changes.push(`${id}:${p.status}`));
    gd.onDenied((d) => denials.push(`${d.user_id}:${d.reason}`));
    gd.onState((s) => states.push(s));
    const answer = gd.subscribe(["bob", "carol", "bob"]);
    gd.setStatus("busy");
    await until("a socket", () => W.all.length === 1);
    const ws = W.all[0];
    check("nothing is sent before hello", ws.sent.length === 0);
    ws.open({ status: "online" });
    check("state: connecting, then open after hello", gd.state === "open" && json(states) === '["connecting","open"]', json(states));
    const sub = ws.of("subscribe")[0];
    check("after hello: the chosen status is sent", ws.of("set_status")[0]?.status === "busy", json(ws.sent));
    // The self frame right after hello shows the status from before this
    // client's choice, not another device's choice.
    ws.deliver({ type: "self", status: "online", devices: 1 });
    check("self: a frame before the choice is confirmed is not adopted", gd.chosenStatus === "busy", gd.chosenStatus);
    ws.deliver({ type: "self", status: "busy", devices: 1 });
    check("after hello: one subscribe, ids deduplicated, with an id", sub && json(sub.user_ids) === '["bob","carol"]' && typeof sub.id === "string", json(sub));
    ws.deliver({ type: "presence_init", id: sub.id, users: [{ user_id: "bob", status: "online" }] });
    ws.deliver({ type: "denied", id: sub.id, user_id: "carol", reason: "not_mutual_followers" });
    const res = await answer;
    check("subscribe resolves with users and denials", json(res.users) === '[{"user_id":"bob","status":"online"}]' && res.denied.length === 1 && res.denied[0].user_id === "carol", json(res));
    check("a denial is an event and ends the subscription", json(denials) === '["carol:not_mutual_followers"]' && json(gd.subscriptions) === '["bob"]', json(gd.subscriptions));
    check("presence_init is a change", json(changes) === '["bob:online"]', json(changes));

    ws.deliver({ type: "presence_batch", updates: [{ user_id: "bob", status: "busy" }, { user_id: "stranger", status: "online" }] });
    ws.deliver({ type: "presence_batch", updates: [{ user_id: "bob", status: "busy" }] });
    check("batches: a change per new state of a watched user only", json(changes) === '["bob:online","bob:busy"]', json(changes));
    check("presence() holds the newest", gd.presence("bob")?.status === "busy" && gd.presence("stranger") === undefined);

    ws.deliver({ type: "presence_batch", updates: [{ user_id: "bob", status: "offline", last_seen: 1700000000 }] });
    check("last_seen is kept", gd.presence("bob")?.last_seen === 1700000000);

    // The connection drops: back off, reconnect, restore.
    ws.drop(1006, "");
    check("a dropped socket means reconnecting", gd.state === "reconnecting");
    await until("a new socket after the backoff", () => W.all.length === 2, 2000);
    const ws2 = W.all[1];
    ws2.open({ status: "busy" });
    check("after reconnect: subscriptions restored", json(ws2.of("subscribe").flatMap((s) => s.user_ids)) === '["bob"]', json(ws2.sent));
    check("after reconnect: no set_status when the server already has it", ws2.of("set_status").length === 0, json(ws2.sent));

    // Another device chose invisible: a reconnect must not undo it.
    ws2.deliver({ type: "self", status: "invisible", devices: 2 });
    check("self: another device's choice is adopted", gd.chosenStatus === "invisible" && gd.self?.devices === 2, `${gd.chosenStatus} ${json(gd.self)}`);
    ws2.deliver({ type: "self", status: "away", devices: 2 });
    check("self: an automatic away is not a choice", gd.chosenStatus === "invisible" && gd.self?.status === "away");

    // The gateway drains: reconnect soon, with jitter.
    const t0 = Date.now();
    let drainDelay = -1;
    const off = gd.onState((s, d) => {
      if (s === "reconnecting") drainDelay = d.delay;
    });
    ws2.drop(1001, "gateway draining");
    off();
    check("1001: reconnect within the drain jitter", drainDelay >= 0 && drainDelay < 50, `delay ${drainDelay}`);
    await until("1001: a new socket soon", () => W.all.length === 3, 1000);
    check("1001: reconnected promptly", Date.now() - t0 < 1000);
    const ws3 = W.all[2];
    ws3.open({ status: "online" });
    check("after reconnect: the chosen status is sent again", ws3.of("set_status")[0]?.status === "invisible", json(ws3.sent));

    // A revoked subscription.
    ws3.deliver({ type: "denied", user_id: "bob", reason: "not_mutual_followers" });
    check("revoked: bob is no longer watched", gd.subscriptions.length === 0 && gd.presence("bob") === undefined);

    // An error frame answering a subscribe rejects it, and is an event.
    const errs = [];
    gd.onError((e) => errs.push(e));
    const failing = gd.subscribe(["dave"]);
    const id = ws3.of("subscribe").at(-1).id;
    ws3.deliver({ type: "error", id, code: "bad_request", message: "no" });
    let rejected = null;
    await failing.catch((e) => (rejected = e));
    check("error frame: the subscribe promise rejects with the code", rejected?.code === "bad_request", String(rejected));
    check("error frame: an error event with the echoed id", errs.length === 1 && errs[0].id === id && errs[0].code === "bad_request", json(errs));

    // unavailable and rate_limited: nothing happened at the gateway; the
    // subscribe goes again after a backoff, with a new id, and its promise
    // resolves with the answer to that one.
    for (const code of ["unavailable", "rate_limited"]) {
      const n = ws3.of("subscribe").length;
      const retried = gd.subscribe(["frank"]);
      const first = ws3.of("subscribe").at(-1);
      ws3.deliver({ type: "error", id: first.id, code, message: "try again" });
      check(`${code}: an error event`, errs.at(-1)?.code === code && errs.at(-1)?.id === first.id, json(errs));
      check(`${code}: not sent again at once`, ws3.of("subscribe").length === n + 1, json(ws3.of("subscribe")));
      await until(`${code}: the subscribe is sent again`, () => ws3.of("subscribe").length === n + 2, 2000);
      const again = ws3.of("subscribe").at(-1);
      check(`${code}: the same users, a new id`, json(again.user_ids) === '["frank"]' && again.id !== first.id, json(again));
      ws3.deliver({ type: "presence_init", id: again.id, users: [{ user_id: "frank", status: "busy" }] });
      const got = await retried;
      check(`${code}: the promise resolves with the answer`, got.users[0]?.status === "busy", json(got));
    }

    // close: pending requests reject, the socket closes with 1000, for good.
    const pending = gd.subscribe(["erin"]);
    gd.close();
    let closedErr = null;
    await pending.catch((e) => (closedErr = e));
    check("close: pending subscribes reject", closedErr instanceof Error);
    check("close: the socket is closed with 1000", ws3.closedWith?.code === 1000, json(ws3.closedWith));
    check("close: state is closed", gd.state === "closed");
    throws("close: connect afterwards throws", () => gd.connect(), Error);
  }

  // --- backoff grows while connections keep failing, and resets ---
  {
    const W = fakeWebSocket();
    const delays = [];
    const gd = new m.GreenDot({ user: "me", WebSocket: W, trackVisibility: false, url: "ws://h.example", backoffBaseMs: 10, backoffMaxMs: 40 });
    gd.onState((s, d) => s === "reconnecting" && delays.push([d.attempt, d.delay]));
    for (let i = 0; i < 6; i++) {
      await until(`backoff: attempt ${i + 1}`, () => W.all.length === i + 1, 2000);
      W.all[i].drop(1006);
    }
    const within = delays.every(([attempt, delay]) => delay >= 0 && delay < Math.min(40, 10 * 2 ** (attempt - 1)));
    check("backoff: every delay is under its cap", within && delays.length === 6, json(delays));
    check("backoff: attempts count up", json(delays.map((d) => d[0])) === "[1,2,3,4,5,6]", json(delays));
    gd.close();
  }

  // --- heartbeats at the server's interval ---
  {
    const W = fakeWebSocket();
    const gd = new m.GreenDot({ user: "me", WebSocket: W, ...quiet, url: "ws://h.example" });
    await until("heartbeats: a socket", () => W.all.length === 1);
    W.all[0].open({ heartbeat_interval_ms: 100 });
    await sleep(550);
    const n = W.all[0].of("heartbeat").length;
    check("heartbeats: about one per interval", n >= 3 && n <= 7, `${n} in 550 ms at 100 ms`);
    W.all[0].drop(1006);
    const after = W.all[0].sent.length;
    await sleep(250);
    check("heartbeats stop with the socket", W.all[0].sent.length === after);
    gd.close();
  }

  // --- activity on input: at once, then at most once per interval ---
  {
    const W = fakeWebSocket();
    const gd = new m.GreenDot({ user: "me", WebSocket: W, backoffBaseMs: 20, url: "ws://h.example", activityIntervalMs: 300 });
    await until("activity: a socket", () => W.all.length === 1);
    const ws = W.all[0];
    ws.open();
    for (let i = 0; i < 5; i++) window.dispatchEvent(new KeyboardEvent("keydown", { key: "a" }));
    check("activity: the first input is sent at once", ws.of("activity").length === 1, json(ws.sent));
    window.dispatchEvent(new PointerEvent("pointerdown"));
    check("activity: more input in the window waits", ws.of("activity").length === 1);
    await until("activity: one more at the end of the window", () => ws.of("activity").length === 2, 1500);
    await sleep(400);
    check("activity: nothing without input", ws.of("activity").length === 2, json(ws.sent));
    gd.close();
    window.dispatchEvent(new KeyboardEvent("keydown", { key: "a" }));
    check("activity: a closed client stops listening", ws.of("activity").length === 2);
  }

  // --- rooms: ids, meta and signals are checked before anything is sent ---
  {
    check("validRoomId takes doc:42", m.validRoomId("doc:42") && m.validRoomId("game:7:lobby") && m.validRoomId("a_b-C"));
    check("validRoomId refuses the empty, the long, dots and lease_ended",
      !m.validRoomId("") && !m.validRoomId("x".repeat(129)) && m.validRoomId("x".repeat(128)) &&
      !m.validRoomId("doc.42") && !m.validRoomId("doc 42") && !m.validRoomId("lease_ended") && !m.validRoomId(42));
    const W = fakeWebSocket();
    const gd = new m.GreenDot({ user: "me", WebSocket: W, ...quiet, url: "ws://h.example" });
    await until("rooms args: a socket", () => W.all.length === 1);
    const ws = W.all[0];
    ws.open();
    throws("room rejects a bad id", () => gd.room("doc/42"));
    throws("room rejects lease_ended", () => gd.room("lease_ended"));
    throws("room rejects an array meta", () => gd.room("doc:1", ["x"]));
    throws("room rejects a null meta", () => gd.room("doc:1", null));
    throws("room rejects a meta over 1 KiB", () => gd.room("doc:1", { name: "é".repeat(600) }), RangeError);
    check("nothing is sent for refused rooms", ws.of("join").length === 0 && gd.rooms.length === 0, json(ws.sent));
    const r = gd.room("doc:1", { name: "x".repeat(1000) });
    check("a meta of 1 KiB is taken", ws.of("join").length === 1);
    throws("signal rejects a bad type", () => r.signal("Cursor"));
    throws("signal rejects a long type", () => r.signal("x".repeat(33)));
    throws("signal rejects data that is not JSON", () => r.signal("x", () => {}));
    throws("signal rejects data over its limit", () => r.signal("x", "y".repeat(m.MAX_SIGNAL_BYTES)), RangeError);
    throws("updateMeta rejects a string", () => r.updateMeta("x"));
    throws("on rejects an unknown room event", () => r.on("change", () => {}));
    check("nothing more was sent", ws.sent.filter((x) => x.type !== "join").length === 0, json(ws.sent));
    r.leave();
    throws("a left room's methods throw", () => r.typing(), Error);
    gd.close();
  }

  // --- rooms: join, state, diffs, signals, typing, re-sync after a reconnect ---
  {
    const W = fakeWebSocket();
    const gd = new m.GreenDot({ user: "me", WebSocket: W, ...quiet, url: "ws://h.example" });
    const r = gd.room("doc:42", { name: "Me" });
    check("room: joining before the connection", r.state === "joining" && r.id === "doc:42" && r.meta.name === "Me");
    check("room: the same id gives the same room", gd.room("doc:42") === r && gd.rooms.length === 1);
    const seen = [];
    const typing = [];
    const signals = [];
    for (const ev of ["join", "leave", "update", "sync", "denied", "error"]) {
      r.on(ev, (x, prev) => seen.push(`${ev}:${ev === "sync" ? [...x.keys()].join(",") : ev === "update" ? `${x.user_id}<-${prev.conns.length}` : x.user_id ?? x.reason ?? x.code}`));
    }
    r.on("typing", (users) => typing.push(users.join(",")));
    r.on("signal", (s) => signals.push(s));
    await until("room: a socket", () => W.all.length === 1);
    const ws = W.all[0];
    ws.open({ conn_id: "m1" });
    const join = ws.of("join")[0];
    check("room: joined after hello, with the meta and an id", join?.room === "doc:42" && join.meta?.name === "Me" && typeof join.id === "string", json(ws.sent));
    check("room: no typing or signal before the room's state", r.typing() === false && r.signal("cursor") === false && ws.of("typing").length + ws.of("signal").length === 0, json(ws.sent));
    const conn = (id, name, since = 1) => ({ conn_id: id, meta: { name }, since });
    ws.deliver({ type: "room_diff", room: "doc:42", joins: [{ user_id: "early", conns: [conn("e1", "E")] }], leaves: [], count: 1 });
    check("room: a diff before the state is left to the state", seen.length === 0 && r.members.size === 0, json(seen));
    ws.deliver({
      type: "room_state", id: join.id, room: "doc:42", count: 3, truncated: false,
      members: [
        { user_id: "me", conns: [conn("m1", "Me")] },
        { user_id: "bob", conns: [conn("b1", "Bob"), conn("b2", "Bob")] },
        { user_id: "carol", conns: [conn("c1", "Carol")] },
      ],
    });
    check("room: the state joins every member, then syncs", json(seen) === '["join:me","join:bob","join:carol","sync:me,bob,carol"]', json(seen));
    check("room: joined, with members and count", r.state === "joined" && r.count === 3 && !r.truncated && r.members.size === 3);
    check("room: a member's connections and meta", r.member("bob")?.conns.length === 2 && r.member("bob").conns[0].meta.name === "Bob" && r.member("bob").conns[0].since === 1, json(r.member("bob")));
    ws.deliver({ type: "room_state", room: "other", members: [{ user_id: "x", conns: [conn("x1", "X")] }], count: 1 });
    check("room: frames of other rooms pass by", r.members.size === 3 && !r.member("x"));

    seen.length = 0;
    ws.deliver({ type: "room_diff", room: "doc:42", joins: [{ user_id: "dave", conns: [conn("d1", "Dave", 2)] }, { user_id: "carol", conns: [conn("c1", "Caroline")] }], leaves: [{ user_id: "bob", conns: [{ conn_id: "b2" }] }], count: 4 });
    check("room: a diff joins, updates a meta and drops a connection", json(seen) === '["update:bob<-2","join:dave","update:carol<-1"]', json(seen));
    check("room: the diff is in the members", r.member("carol").conns[0].meta.name === "Caroline" && r.member("bob").conns.length === 1 && r.count === 4, json([...r.members.values()]));
    seen.length = 0;
    ws.deliver({ type: "room_diff", room: "doc:42", joins: [{ user_id: "dave", conns: [conn("d1", "Dave", 2)] }], leaves: [], count: 4 });
    check("room: a join of what is known is no event", seen.length === 0, json(seen));
    ws.deliver({ type: "room_diff", room: "doc:42", joins: [], leaves: [{ user_id: "bob", conns: [{ conn_id: "b1" }] }], count: 3 });
    check("room: the last connection's leave is the user's", json(seen) === '["leave:bob"]' && !r.member("bob") && r.count === 3, json(seen));

    // Typing: who types now, each for expires_ms after their last signal.
    ws.deliver({ type: "room_signal", room: "doc:42", signals: [{ user_id: "carol", conn_id: "c1", signal: "typing", expires_ms: 300 }] });
    check("typing: carol types", json(typing) === '["carol"]' && json(r.typingUsers) === '["carol"]', json(typing));
    ws.deliver({ type: "room_signal", room: "doc:42", signals: [{ user_id: "dave", conn_id: "d1", signal: "typing", expires_ms: 60000 }, { user_id: "carol", conn_id: "c1", signal: "typing", expires_ms: 300 }] });
    check("typing: dave too, carol once", json(typing) === '["carol","carol,dave"]', json(typing));
    await until("typing: carol's expires", () => typing.length === 3, 3000);
    check("typing: dave still types", json(typing) === '["carol","carol,dave","dave"]' && json(r.typingUsers) === '["dave"]', json(typing));
    ws.deliver({ type: "room_diff", room: "doc:42", joins: [], leaves: [{ user_id: "dave", conns: [{ conn_id: "d1" }] }], count: 2 });
    check("typing: a leave ends it", json(typing) === '["carol","carol,dave","dave",""]' && r.typingUsers.length === 0, json(typing));
    ws.deliver({ type: "room_signal", room: "doc:42", signals: [{ user_id: "carol", conn_id: "c1", signal: "cursor", data: { x: 1 }, expires_ms: 3000 }] });
    check("signal: an event with its data and expiry", signals.length === 1 && signals[0].signal === "cursor" && signals[0].data.x === 1 && signals[0].user_id === "carol" && signals[0].expires_at >= Date.now() + 2000, json(signals));
    check("signal: not typing", typing.length === 4);

    // What this client sends.
    check("typing(): the first call sends", r.typing() === true && ws.of("typing").length === 1 && ws.of("typing")[0].room === "doc:42", json(ws.sent));
    check("typing(): calls within the interval do not", r.typing() === false && r.typing() === false && ws.of("typing").length === 1);
    check("signal(): sent with its data and an id", r.signal("cursor", { x: 3 }) === true && json({ ...ws.of("signal")[0], id: "x" }) === '{"type":"signal","id":"x","room":"doc:42","signal":"cursor","data":{"x":3}}', json(ws.of("signal")));
    r.updateMeta({ name: "Me2" });
    const upd = ws.of("room_update")[0];
    check("updateMeta(): a room_update with an id", upd?.room === "doc:42" && upd.meta.name === "Me2" && typeof upd.id === "string" && r.meta.name === "Me2", json(upd));
    const errs = [];
    gd.onError((e) => errs.push(e.code));
    ws.deliver({ type: "error", id: upd.id, code: "rate_limited", message: "slow down" });
    check("room: an error answering its message is its error, and the client's", seen.at(-1) === "error:rate_limited" && json(errs) === '["rate_limited"]', json(seen));
    r.updateMeta({ name: "Me3" });
    await until("updateMeta(): a refused update is sent again", () => ws.of("room_update").length >= 2, 2000);
    const upd2 = ws.of("room_update");
    check("updateMeta(): sent again once, with the newest meta", upd2.length === 2 && upd2[1].meta.name === "Me3" && upd2[1].id !== upd.id, json(upd2));
    r.updateMeta({ name: "Me2" });

    // The connection drops; while away, carol left and erin came; me has a new connection.
    seen.length = 0;
    ws.drop(1006);
    check("room: joining again while reconnecting", r.state === "joining" && r.members.size === 2);
    await until("room: a new socket", () => W.all.length === 2, 2000);
    const ws2 = W.all[1];
    ws2.open({ conn_id: "m2" });
    check("room: no typing on the new connection before its state", r.typing() === false && ws2.of("typing").length === 0);
    const join2 = ws2.of("join")[0];
    check("room: joined again after the reconnect, with the newest meta", join2?.room === "doc:42" && join2.meta.name === "Me2" && join2.id !== join.id, json(ws2.sent));
    ws2.deliver({ type: "room_diff", room: "doc:42", joins: [{ user_id: "zed", conns: [conn("z1", "Z")] }], leaves: [], count: 3 });
    check("room: old news before the new state is ignored", seen.length === 0, json(seen));
    ws2.deliver({
      type: "room_state", id: join2.id, room: "doc:42", count: 2, truncated: false,
      members: [{ user_id: "me", conns: [conn("m2", "Me2")] }, { user_id: "erin", conns: [conn("e1", "Erin")] }],
    });
    check("room: the re-sync tells what changed, once", json(seen) === '["update:me<-1","leave:carol","join:erin","sync:me,erin"]', json(seen));
    check("room: members after the re-sync", json([...r.members.keys()]) === '["me","erin"]' && r.member("me").conns[0].conn_id === "m2" && r.state === "joined");
    check("typing(): sends at once on a new connection", r.typing() === true && ws2.of("typing").length === 1);

    // Denied: the room ends, and is not joined again.
    seen.length = 0;
    const r2 = gd.room("secret:1");
    const j3 = ws2.of("join").find((x) => x.room === "secret:1");
    check("room: a join without meta has none", j3 && !("meta" in j3), json(j3));
    r2.on("denied", (d) => seen.push(`denied:${d.room}:${d.reason}:${d.id === j3.id}`));
    ws2.deliver({ type: "room_denied", id: j3.id, room: "secret:1", reason: "not_allowed" });
    check("room: denied is an event with the reason and id", json(seen) === '["denied:secret:1:not_allowed:true"]' && r2.state === "denied", json(seen));
    check("room: a denied room is no longer the client's", gd.rooms.length === 1 && gd.rooms[0] === r);
    throws("room: a denied room's methods throw", () => r2.updateMeta({}), Error);

    // Leave: a leave frame, no more joins.
    r.leave();
    const leaves = ws2.of("leave");
    check("leave(): a leave frame with an id, state left, members gone", leaves.length === 1 && leaves[0].room === "doc:42" && typeof leaves[0].id === "string" && r.state === "left" && r.members.size === 0 && gd.rooms.length === 0, json(leaves));
    ws2.drop(1006);
    await until("leave: a new socket", () => W.all.length === 3, 2000);
    W.all[2].open();
    check("leave: the room is not joined again", W.all[2].of("join").length === 0, json(W.all[2].sent));
    const r3 = gd.room("doc:42");
    check("room: joining again after leave gives a new room", r3 !== r && W.all[2].of("join").length === 1);
    gd.close();
    check("close: the rooms are left", r3.state === "left" && gd.rooms.length === 0);
    throws("close: room() afterwards throws", () => gd.room("doc:1"), Error);
  }

  // --- rooms: typing() repeats after the interval while the person types ---
  {
    const W = fakeWebSocket();
    const gd = new m.GreenDot({ user: "me", WebSocket: W, ...quiet, url: "ws://h.example" });
    const r = gd.room("doc:7");
    await until("typing interval: a socket", () => W.all.length === 1);
    W.all[0].open();
    W.all[0].deliver({ type: "room_state", room: "doc:7", members: [], count: 0, truncated: false });
    const t0 = Date.now();
    r.typing();
    await until("typing interval: a second frame while typing", () => {
      r.typing();
      return W.all[0].of("typing").length === 2;
    }, m.TYPING_INTERVAL_MS + 3000);
    const gap = Date.now() - t0;
    check("typing interval: the second frame no sooner than the interval", gap >= m.TYPING_INTERVAL_MS - 5, `${gap} ms`);
    gd.close();
  }

  // --- requests: a window of 8 waiting, merged at hello, sent again when refused ---
  {
    const W = fakeWebSocket();
    const gd = new m.GreenDot({ user: "me", WebSocket: W, ...quiet, url: "ws://h.example" });
    const early = Array.from({ length: 250 }, (_, i) => gd.subscribe(`e${i}`));
    await until("requests: a socket", () => W.all.length === 1);
    const ws = W.all[0];
    ws.open();
    const subs = ws.of("subscribe");
    check("hello: the waiting subscribe calls go in messages of at most 100 ids", json(subs.map((x) => x.user_ids.length)) === "[100,100,50]", json(subs.map((x) => x.user_ids.length)));
    for (const x of subs) ws.deliver({ type: "presence_init", id: x.id, users: x.user_ids.map((u) => ({ user_id: u, status: "online" })) });
    const early1 = await Promise.all(early);
    check("hello: each call resolves with its user", early1.every((r, i) => r.users.length === 1 && r.users[0].user_id === `e${i}`), json(early1.slice(0, 2)));

    // 20 subscribe calls while open: 8 go, the rest as answers come.
    const n0 = ws.of("subscribe").length;
    const calls = Array.from({ length: 20 }, (_, i) => gd.subscribe(`w${i}`));
    const sent = () => ws.of("subscribe").slice(n0);
    check("window: 8 requests wait at once", sent().length === 8, json(sent().length));
    ws.deliver({ type: "presence_init", id: sent()[2].id, users: [{ user_id: "w2", status: "online" }] });
    check("window: an answer frees the requests sent before it", sent().length === 11, json(sent().length));
    // The message rate limit drops one: every waiting request goes again,
    // after a backoff, with new ids.
    const before = sent().slice(3).map((x) => x.user_ids[0]);
    ws.deliver({ type: "error", code: "rate_limited", message: "too many messages" });
    check("dropped: nothing sent again at once", sent().length === 11, json(sent().length));
    await until("dropped: the waiting requests are sent again", () => sent().length === 19, 2000);
    check("dropped: the same users again, new ids", json(sent().slice(11).map((x) => x.user_ids[0])) === json(before) && !sent().slice(11).some((x) => sent().slice(0, 11).some((y) => y.id === x.id)), json(sent().slice(11)));
    // Answer the rest: the first two (which the gateway answered before
    // the third), and those sent again.
    const answer = (x) => ws.deliver({ type: "presence_init", id: x.id, users: x.user_ids.map((u) => ({ user_id: u, status: "busy" })) });
    answer(sent()[0]);
    answer(sent()[1]);
    // Each answer lets more go, within the request rate.
    let next = 11;
    let answered = 0;
    for (const c of calls) c.then(() => answered++);
    await until("window: every call answered", () => {
      while (next < sent().length) answer(sent()[next++]);
      return answered === calls.length;
    }, 5000);
    const all = await Promise.all(calls);
    check("window: every call answered", all.every((r) => r.users.length === 1), json(all.filter((r) => r.users.length !== 1)));
    check("window: every user watched", Array.from({ length: 20 }, (_, i) => gd.presence(`w${i}`)).every((p) => p !== undefined));

    // A join refused: sent again after a backoff, then joined.
    // (Requests go at most 10 a second after a burst of 20: wait for each.)
    const r = gd.room("doc:1", { n: 1 });
    await until("join: sent", () => ws.of("join").length === 1, 2000);
    const j1 = ws.of("join").at(-1);
    ws.deliver({ type: "error", id: j1.id, code: "rate_limited", message: "too many requests in progress" });
    r.updateMeta({ n: 2 });
    await until("join: sent again", () => ws.of("join").length === 2, 2000);
    const j2 = ws.of("join").at(-1);
    check("join: sent again with the newest meta, and no room_update besides", j2.id !== j1.id && j2.meta.n === 2 && ws.of("room_update").length === 0, json(ws.sent.slice(-3)));
    ws.deliver({ type: "room_state", id: j2.id, room: "doc:1", members: [], count: 0, truncated: false });
    check("join: joined", r.state === "joined");
    // unavailable too, for a join.
    const r2 = gd.room("doc:2");
    await until("join doc:2: sent", () => ws.of("join").length === 3, 2000);
    const k1 = ws.of("join").at(-1);
    ws.deliver({ type: "error", id: k1.id, code: "unavailable", message: "no NATS" });
    await until("join unavailable: sent again", () => ws.of("join").filter((x) => x.room === "doc:2").length === 2, 2000);
    check("join unavailable: still joining", r2.state === "joining");
    // A leave refused: sent again; a leave refused and then a join: not.
    r.leave();
    await until("leave: sent", () => ws.of("leave").length === 1, 2000);
    const l1 = ws.of("leave").at(-1);
    check("leave: with an id", l1?.room === "doc:1" && typeof l1.id === "string", json(l1));
    ws.deliver({ type: "error", id: l1.id, code: "rate_limited", message: "too many requests in progress" });
    await until("leave: sent again", () => ws.of("leave").length === 2, 2000);
    check("leave: a new id", ws.of("leave")[1].id !== l1.id && ws.of("leave")[1].room === "doc:1");
    r2.leave();
    await until("leave doc:2: sent", () => ws.of("leave").length === 3, 2000);
    const l2 = ws.of("leave").at(-1);
    const joins = ws.of("join").length;
    gd.room("doc:2");
    ws.deliver({ type: "error", id: l2.id, code: "rate_limited", message: "too many requests in progress" });
    await until("leave then join: the join goes", () => ws.of("join").length === joins + 1, 2000);
    // An unsubscribe refused: sent again for the users still unwatched.
    gd.unsubscribe(["w0", "w1"]);
    await until("unsubscribe: sent", () => ws.of("unsubscribe").length === 1, 2000);
    const u1 = ws.of("unsubscribe").at(-1);
    check("unsubscribe: with an id", typeof u1?.id === "string" && json(u1.user_ids) === '["w0","w1"]', json(u1));
    gd.subscribe("w1");
    ws.deliver({ type: "error", id: u1.id, code: "rate_limited", message: "too many requests in progress" });
    await until("unsubscribe: sent again", () => ws.of("unsubscribe").length === 2, 2000);
    check("unsubscribe: only the users still unwatched", json(ws.of("unsubscribe")[1].user_ids) === '["w0"]', json(ws.of("unsubscribe")));
    check("leave then join: the refused leave is not sent again", ws.of("leave").filter((x) => x.room === "doc:2").length === 1, json(ws.of("leave")));
    gd.close();
  }

  // --- close codes that say not to come back as is ---
  {
    for (const [code, reason, token, final] of [
      [1002, "", undefined, true],
      [1003, "", undefined, true],
      [1007, "", undefined, true],
      [1009, "", undefined, true],
      [1008, "rate limit exceeded", undefined, true],
      [1008, "token expired", "tok", true],
      [1008, "token expired", "fn", false],
      [1008, "rate limit exceeded", "fn", true],
      [1008, "session expired", "session", false],
      [1008, "session ended", "session", true],
      [1008, "session expired", undefined, true],
      [1011, "", undefined, false],
    ]) {
      const W = fakeWebSocket();
      let n = 0;
      const auth = token === undefined ? { user: "me" } : token === "session" ? { session: true } : { token: token === "fn" ? () => `t${++n}` : token };
      const gd = new m.GreenDot({ ...auth, WebSocket: W, ...quiet, url: "ws://h.example" });
      const states = [];
      const errs = [];
      gd.onState((s, d) => states.push(`${s}:${d.code ?? ""}`));
      gd.onError((e) => errs.push(`${e.code}:${e.close_code}:${e.reason}`));
      await until(`close ${code}: a socket`, () => W.all.length === 1);
      W.all[0].open();
      W.all[0].drop(code, reason);
      const name = `close ${code} ${reason} (token ${token ?? "none"})`;
      if (final) {
        check(`${name}: closed for good`, gd.state === "closed" && states.at(-1) === `closed:${code}`, json(states));
        check(`${name}: an error event with the code and reason`, json(errs) === json([`refused:${code}:${reason}`]), json(errs));
        throws(`${name}: connect() throws`, () => gd.connect(), Error);
      } else {
        check(`${name}: reconnecting`, gd.state === "reconnecting" && errs.length === 0, `${gd.state} ${json(errs)}`);
        await until(`${name}: a new socket`, () => W.all.length === 2, 2000);
        if (token === "fn") check(`${name}: with a fresh token`, W.all[1].url.endsWith("token=t2"), W.all[1].url);
      }
      gd.close();
    }
  }

  // --- against the real gateway that serves this page ---
  {
    const [me, friend] = users;
    const gd = new m.GreenDot({ user: me, trackVisibility: false });
    const errors = [];
    const selves = [];
    gd.onError((e) => errors.push(e));
    gd.onSelf((s) => selves.push(s.status));
    await until("real: open", () => gd.state === "open", 5000);
    check("real: hello names the user", gd.hello?.user_id === me, json(gd.hello));
    check("real: the server's heartbeat interval", gd.hello?.heartbeat_interval_ms > 0);
    gd.send({ type: "no_such_type", id: "x1" });
    await until("real: an error frame", () => errors.length > 0);
    check("real: unknown_type with the echoed id", errors[0]?.code === "unknown_type" && errors[0]?.id === "x1", json(errors));
    const res = await gd.subscribe([friend, "stranger"]);
    check("real: the friend's presence", res.users.length === 1 && res.users[0].user_id === friend && res.users[0].status === "offline", json(res));
    check("real: the stranger is denied", res.denied.length === 1 && res.denied[0].user_id === "stranger" && res.denied[0].reason === "not_mutual_followers", json(res));
    gd.setStatus("busy");
    await until("real: self says busy", () => selves.includes("busy"));
    gd.setStatus("online");
    await until("real: self says online", () => selves.at(-1) === "online");

    // A room: the join's answer lists this connection with its meta, and
    // its own meta change comes back as an update.
    const room = gd.room("unit:room", { name: "Me" });
    const updates = [];
    room.on("update", (mem) => updates.push(mem.conns[0]?.meta?.name));
    await until("real: room joined", () => room.state === "joined", 5000);
    const mine = room.member(me);
    check("real: room_state lists this connection with its meta", room.count === 1 && mine?.conns.length === 1 && mine.conns[0].conn_id === gd.hello.conn_id && mine.conns[0].meta.name === "Me" && mine.conns[0].since > 0, json([...room.members.values()]));
    check("real: updateMeta is sent", room.updateMeta({ name: "Me again" }) === true);
    await until("real: the meta change comes back", () => updates.includes("Me again"), 5000);
    check("real: the member has the new meta", room.member(me)?.conns[0].meta.name === "Me again", json(room.member(me)));

    // The friend joins too, types and signals; this client sees both, and
    // the friend's page never gets its own signals back.
    const other = new m.GreenDot({ user: friend, trackVisibility: false });
    const theirs = other.room("unit:room", { name: "Friend" });
    await until("real: the friend is in the room", () => theirs.state === "joined" && room.member(friend) !== undefined, 5000);
    check("real: both are counted", room.count === 2 && theirs.count === 2, `${room.count} ${theirs.count}`);
    const signals = [];
    room.on("signal", (sig) => signals.push(sig));
    check("real: typing is sent once joined", theirs.typing() === true);
    await until("real: the friend is typing", () => room.typingUsers.includes(friend), 5000);
    check("real: a signal is sent", theirs.signal("cursor", { x: 5 }) === true);
    await until("real: the friend's signal arrives", () => signals.some((sig) => sig.signal === "cursor" && sig.data?.x === 5 && sig.user_id === friend && sig.expires_ms > 0), 5000);
    check("real: no signal comes back to its sender", theirs.typingUsers.length === 0);
    other.close();
    await until("real: the friend leaves after the offline grace", () => room.member(friend) === undefined && room.count === 1, 10000);
    room.leave();
    check("real: left", room.state === "left" && gd.rooms.length === 0);
    gd.close();
  }

  return { passed, failures };
}
