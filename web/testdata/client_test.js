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
    ws3.deliver({ type: "error", id, code: "unavailable", message: "try again" });
    let rejected = null;
    await failing.catch((e) => (rejected = e));
    check("error frame: the subscribe promise rejects with the code", rejected?.code === "unavailable", String(rejected));
    check("error frame: an error event with the echoed id", errs.length === 1 && errs[0].id === id && errs[0].code === "unavailable", json(errs));

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
    gd.close();
  }

  return { passed, failures };
}
