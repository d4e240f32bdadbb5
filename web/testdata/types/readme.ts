// The examples of web/README.md, as an app written in TypeScript has them.
import { GreenDot } from "../../greendot.js";

declare function showDot(userId: string, status: string, lastSeen?: number): void;
declare function showMyStatus(status: string, devices: number): void;
declare function showConnection(state: string): void;
declare function addAvatar(userId: string, meta: unknown): void;
declare function removeAvatar(userId: string): void;
declare function redrawAvatar(userId: string, meta: unknown): void;
declare function showTyping(userIds: string[]): void;
declare function moveCursor(userId: string, data: unknown): void;
declare const input: HTMLInputElement;

const gd = new GreenDot({
  url: "wss://presence.example.com/ws",    // default: /ws on the page's host
  token: () => fetch("/presence-token").then((r) => r.text()), // a JWT whose sub is the user id
  device: "web",
  platform: "web",                         // web, desktop or mobile: watchers see where you are
});
gd.onChange((userId, p) => showDot(userId, p.status, p.last_seen));
gd.onSelf((self) => showMyStatus(self.status, self.devices));
gd.onState((state) => showConnection(state)); // connecting, open, reconnecting, suspended, closed
gd.onDenied((d) => console.info(`not allowed to watch ${d.user_id}: ${d.reason}`));
gd.onError((e) => console.warn(e.code, e.message));

await gd.subscribe(["bob", "carol"]);      // resolves with {users, denied}
gd.setStatus("busy");                       // online, away, busy or invisible
gd.presence("bob");                         // {user_id, status, last_seen?, platforms?} or undefined
gd.unsubscribe(["carol"]);
gd.close();

new GreenDot({ user: "alice" });

const room = gd.room("doc:42", { name: "Alice", color: "#0969da" });

room.on("join", (m) => addAvatar(m.user_id, m.conns[0].meta));   // a user came in
room.on("leave", (m) => removeAvatar(m.user_id));               // their last connection left
room.on("update", (m, prev) => redrawAvatar(m.user_id, m.conns[0].meta)); // a meta changed, or a connection came or went
room.on("sync", (members) => console.info(`${members.size} here`)); // the server's state: after the join and every reconnect
room.on("typing", (userIds) => showTyping(userIds));            // who is typing now
room.on("signal", (s) => moveCursor(s.user_id, s.data));        // room.signal(...) from the others
room.on("denied", (d) => console.warn(`not in ${d.room}: ${d.reason}`));

input.addEventListener("input", () => room.typing()); // at most one frame per 2 s
room.signal("cursor", { x: 10, y: 20 });              // short-lived, not kept
room.updateMeta({ name: "Alice", color: "#cf222e" });
room.members;                                         // Map: user_id -> {user_id, conns: [{conn_id, meta, since}]}
room.leave();
