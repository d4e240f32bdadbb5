// Outside a browser, the ws package's WebSocket is passed as the constructor.
import WebSocket from "ws";
import { GreenDot } from "../../greendot.js";

const gd = new GreenDot({ url: "ws://127.0.0.1:8080/ws", user: "alice", WebSocket, trackVisibility: false });
gd.onChange((userId, p) => console.log(JSON.stringify({ userId, ...p })));
