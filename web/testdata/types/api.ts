// The rest of what greendot.js exports, used as the declarations say.
import {
  GreenDot, Throttle, STATUSES, STATES, DEFAULTS, MAX_SUBSCRIBE_IDS, MAX_MESSAGE_BYTES, MAX_META_BYTES,
  MAX_SIGNAL_BYTES, TYPING_INTERVAL_MS, SIGNAL_EXPIRES_MS, backoffDelay, validUserId, validRoomId, subscribeChunks,
  type ChosenStatus, type CustomStatus, type Platform, type Presence, type Room, type RoomMember, type ServerError, type State,
} from "../../greendot.js";

// The page's own WebSocket may be passed as the constructor.
const gd = new GreenDot({ ...DEFAULTS, user: "alice", status: "away", WebSocket, trackVisibility: false, connect: false });
gd.on("state", (state: State, detail) => console.log(state, detail.code, detail.reason, detail.delay, detail.attempt));
gd.on("error", (e: ServerError) => console.log(e.code, e.message, e.id, e.close_code, e.reason));
gd.on("denied", (d) => console.log(d.user_id, d.reason, d.id));
gd.connect();
const state: State = gd.state;
const chosen: ChosenStatus | undefined = gd.chosenStatus;
const mine = gd.self?.devices;
const conn = gd.hello?.conn_id;
const watched: string[] = gd.subscriptions;
const rooms: Room[] = gd.rooms;
const all: Map<string, Presence> = gd.presences();
const onPhone: "active" | "idle" | "background" | undefined = all.get("bob")?.platforms?.mobile;
const away: CustomStatus | undefined = all.get("bob")?.custom_status;
const myText: string | undefined = gd.self?.custom_status?.text;
gd.setCustomStatus("In a meeting", "📅", new Date(Date.now() + 3_600_000));
gd.setCustomStatus("Lunch", "", Math.floor(Date.now() / 1000) + 1800);
gd.setCustomStatus();
const platform: Platform = "desktop";
new GreenDot({ user: "alice", platform, connect: false });
gd.subscribe("bob").then(({ users, denied }) => console.log(users.map((p) => p.status), denied.map((d) => d.reason)));
gd.subscribe(new Set(["carol"]));
gd.unsubscribe("bob");
gd.setToken("a.new.jwt");
const sent: boolean = gd.send({ type: "heartbeat" });
gd.background();
gd.background(60_000);

const room = gd.room("game:7:lobby");
const member: RoomMember | undefined = room.member("bob");
const since = member?.conns[0]?.since;
console.log(room.id, room.meta, room.state, room.count, room.truncated, room.typingUsers, room.members.get("bob"));
const off = room.on("error", (e) => console.log(e.code));
off();
room.on("signal", (s) => console.log(s.signal, s.conn_id, s.expires_ms, s.expires_at));

const t = new Throttle(() => {}, 1000, { now: () => 0, setTimeout: (fn, ms) => setTimeout(fn, ms), clearTimeout: (id) => {} });
t.call();
console.log(t.pending);
t.cancel();
t.reset();
const status: ChosenStatus | undefined = STATUSES.find((s) => s === "busy");
const first: State = STATES[0];
const chunks: string[][] = subscribeChunks(["a", "b"], "unsubscribe");
const delay: number = backoffDelay(3, 500, 30_000, Math.random);
const x: unknown = "doc:1";
if (validUserId(x) && validRoomId(x)) console.log(x.length);
console.log(MAX_SUBSCRIBE_IDS, MAX_MESSAGE_BYTES, MAX_META_BYTES, MAX_SIGNAL_BYTES, TYPING_INTERVAL_MS, SIGNAL_EXPIRES_MS);
console.log(state, chosen, mine, conn, watched, rooms, all, sent, since, status, first, chunks, delay);
