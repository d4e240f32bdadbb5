// Type declarations of greendot.js, the browser client of greendot presence.

/** A status a user may choose. */
export type ChosenStatus = "online" | "away" | "busy" | "invisible";

/** What others see of a user: an invisible user looks offline. */
export type PublicStatus = "online" | "away" | "busy" | "offline";

/** A user's own true status, as their devices see it. */
export type SelfStatus = ChosenStatus | "offline";

/** The connection states. */
export type State = "new" | "connecting" | "open" | "reconnecting" | "suspended" | "closed";

/** A watched user's presence. */
export interface Presence {
  readonly user_id: string;
  readonly status: PublicStatus;
  /** Unix seconds; present only where the user's privacy setting lets this watcher see it. */
  readonly last_seen?: number;
  /** The platforms the user is live on, where their clients said which, and whether they are active there (or in the background); absent while offline or invisible. */
  readonly platforms?: Readonly<Partial<Record<Platform, "active" | "idle" | "background">>>;
  /** The user's custom status, if they set one; absent while they are invisible. */
  readonly custom_status?: CustomStatus;
}

/** A custom status: a text and an emoji, with when the server clears it. */
export interface CustomStatus {
  readonly text?: string;
  readonly emoji?: string;
  /** Unix seconds; absent when it does not expire. */
  readonly expires_at?: number;
}

/** The platform a device is on. */
export type Platform = "web" | "desktop" | "mobile";

/** The user's own status and how many of their connections are live. */
export interface Self {
  readonly status: SelfStatus;
  readonly devices: number;
  /** The user's custom status, if they set one. */
  readonly custom_status?: CustomStatus;
}

/** The first frame of a connection. */
export interface Hello {
  readonly type: "hello";
  readonly user_id: string;
  readonly conn_id: string;
  readonly heartbeat_interval_ms: number;
  readonly ttl_ms: number;
  readonly status: SelfStatus;
}

/** A refused or revoked subscription. */
export interface Denial {
  readonly user_id: string;
  /** not_mutual_followers, not_following, too_many_subscriptions, invalid_user_id, not_allowed, authorization_unavailable, or a newer reason. */
  readonly reason: string;
  /** The id of the subscribe message refused; absent when a subscription is revoked later. */
  readonly id?: string;
}

/**
 * An error: an error frame from the gateway (bad_request, unknown_type,
 * invalid_status, rate_limited, unauthorized, unavailable), or a failure in
 * the client (token_failed, connect_failed, bad_frame), or `refused`: the
 * gateway closed the connection with a code that says not to come back as
 * is (1002, 1003, 1007, 1009, or 1008 other than "token expired" with a
 * token function), and the client is closed for good. A request refused
 * with rate_limited (or a subscribe or join with unavailable) is sent
 * again by the client itself; the error event still tells of it.
 */
export interface ServerError {
  readonly code: string;
  readonly message: string;
  /** The id of the message that caused it, when it had one. */
  readonly id?: string;
  /** The close code (refused). */
  readonly close_code?: number;
  /** The close reason (refused). */
  readonly reason?: string;
}

/** What a state change says. */
export interface StateDetail {
  /** The close code of the socket that ended (reconnecting; closed, when the gateway's close code ended the client). */
  readonly code?: number;
  readonly reason?: string;
  /** How long until the next attempt, in ms (reconnecting). */
  readonly delay?: number;
  /** How many attempts failed in a row. */
  readonly attempt?: number;
  /** The user and connection ids (open). */
  readonly user_id?: string;
  readonly conn_id?: string;
}

/** The answer to subscribe. */
export interface SubscribeResult {
  readonly users: Presence[];
  readonly denied: Denial[];
}

/** A room member's meta: a JSON object of at most MAX_META_BYTES (a name, a colour). */
export type RoomMeta = { [field: string]: unknown };

/** One connection of a member in a room. */
export interface RoomConn {
  readonly conn_id: string;
  readonly meta: Readonly<RoomMeta>;
  /** When the connection joined the room, in unix ms. */
  readonly since: number;
}

/** A user in a room, with every connection of theirs that is in it. */
export interface RoomMember {
  readonly user_id: string;
  readonly conns: readonly RoomConn[];
}

/** A signal another member sent to the room. */
export interface RoomSignal {
  readonly user_id: string;
  readonly conn_id: string;
  /** Its type: 1 to 32 of a-z 0-9 _ -. */
  readonly signal: string;
  readonly data?: unknown;
  /** How long it lasts unless repeated, in ms. */
  readonly expires_ms: number;
  /** When it ends (Date.now() time), unless repeated. */
  readonly expires_at: number;
}

/** A refused join. */
export interface RoomDenial {
  readonly room: string;
  /** not_allowed, too_many_rooms, invalid_room, or a newer reason. */
  readonly reason: string;
  /** The id of the join refused. */
  readonly id?: string;
}

/**
 * joining (waiting for the connection or the server's answer, after every
 * reconnect too), joined, denied or left.
 */
export type RoomState = "joining" | "joined" | "denied" | "left";

/**
 * A room this client is in, made by GreenDot.room: its members, kept in
 * step with the server across reconnects, and its members' signals.
 */
export interface Room {
  /** The room id. */
  readonly id: string;
  /** This connection's meta in the room, as last given. */
  readonly meta: RoomMeta | undefined;
  readonly state: RoomState;
  /** The members by user id (a copy). */
  readonly members: Map<string, RoomMember>;
  /** How many users are in the room; more than members.size when truncated. */
  readonly count: number;
  /** Whether the server sent only part of the member list (a large room). */
  readonly truncated: boolean;
  /** The users typing now. */
  readonly typingUsers: string[];
  /** A member by user id. */
  member(userId: string): RoomMember | undefined;

  /** A user came in (their first connection joined, or they were there at the first state). */
  on(event: "join", fn: (member: RoomMember) => void): () => void;
  /** A user left (their last connection left, or they were gone at a re-sync). */
  on(event: "leave", fn: (member: RoomMember) => void): () => void;
  /** A member's connections changed: one joined or left, or changed its meta. */
  on(event: "update", fn: (member: RoomMember, previous: RoomMember) => void): () => void;
  /** The server's state of the room arrived: after the join, and after every reconnect (after the joins, leaves and updates it brought). */
  on(event: "sync", fn: (members: Map<string, RoomMember>) => void): () => void;
  /** A signal other than typing arrived. */
  on(event: "signal", fn: (signal: RoomSignal) => void): () => void;
  /** Who is typing changed: a typing signal arrived from someone new, or expired. */
  on(event: "typing", fn: (userIds: string[]) => void): () => void;
  /** The join was refused; the room ends. */
  on(event: "denied", fn: (denial: RoomDenial) => void): () => void;
  /** An error frame answering one of this room's messages: join, updateMeta, typing, signal (also a client error event). */
  on(event: "error", fn: (error: ServerError) => void): () => void;

  /**
   * Replaces this connection's meta; reports whether it goes out on the open
   * connection (at once, or once the gateway takes more requests: updates
   * that wait are folded into the newest, and one refused is sent again);
   * later joins carry it. Throws a TypeError or RangeError for a meta that
   * is not a JSON object of at most MAX_META_BYTES, and an Error once the
   * room was left or denied (or the client closed).
   */
  updateMeta(meta: RoomMeta): boolean;
  /** The person is typing: call it on every input; sends at most one frame per TYPING_INTERVAL_MS, once the room is joined, and reports whether it sent one. Throws an Error once the room was left or denied (or the client closed). */
  typing(): boolean;
  /** Sends a short-lived signal to the other members; reports whether it was sent (only once the room is joined). Throws for a bad type or data over MAX_SIGNAL_BYTES, and an Error once the room was left or denied (or the client closed). */
  signal(type: string, data?: unknown): boolean;
  /** Leaves the room for good (a leave the gateway refuses is sent again). */
  leave(): void;
}

/**
 * A WebSocket constructor, for runtimes without a global one: the
 * browser's WebSocket, or one of the same shape (the ws package's). The
 * client sets the handlers; it reads data of a message, and code and
 * reason of a close.
 */
export type WebSocketConstructor = new (url: string) => {
  readonly readyState: number;
  send(data: string): void;
  close(code?: number, reason?: string): void;
  // The handlers' event types are the runtime's own (MessageEvent,
  // CloseEvent), which a narrower type here would refuse.
  onmessage: ((ev: any) => void) | null;
  onclose: ((ev: any) => void) | null;
  onerror: ((ev: any) => void) | null;
};

export interface Options {
  /**
   * The gateway: a ws, wss, http or https URL; a URL with no path gets /ws.
   * Default: /ws on the page's own host.
   */
  url?: string;
  /**
   * A JWT (its sub is the user id), or a function returning one, called
   * before every connection so that reconnects use a fresh token (also
   * after setToken, and after the gateway closed the connection with 1008
   * "token expired"; with a string token that close ends the client).
   */
  token?: string | (() => string | Promise<string>);
  /** The user id, for a gateway with dev auth; ignored when a token is given. */
  user?: string;
  /** A device label (web, desktop, ...): 1 to 32 of A-Z a-z 0-9 _ - . and space. */
  device?: string;
  /** The platform this device is on, shown to those who watch the user. */
  platform?: Platform;
  /** A status to choose at every connection. */
  status?: ChosenStatus;
  /** Reconnect backoff: full jitter up to min(backoffMaxMs, backoffBaseMs * 2^attempt). Default 500. */
  backoffBaseMs?: number;
  /** The backoff cap. Default 30000. */
  backoffMaxMs?: number;
  /** After close code 1001 (the gateway drains), reconnect after a random delay below this. Default 1000. */
  drainJitterMs?: number;
  /** A connection that lived this long resets the backoff when it ends. Default 10000. */
  stableAfterMs?: number;
  /** Send idle when the tab has been hidden this long. Default 30000. */
  idleAfterMs?: number;
  /**
   * Close the socket when the tab has been hidden this long, and open it
   * again when the tab is visible. Default 300000 (5 minutes). Browsers
   * throttle the timers of pages hidden longer than 5 minutes to once a
   * minute, which is slower than the heartbeats need.
   */
  closeAfterMs?: number;
  /** Send activity (on input and focus) at most once per this many ms. Default 30000. */
  activityIntervalMs?: number;
  /** Follow Page Visibility and input events. Default true (when there is a document). */
  trackVisibility?: boolean;
  /**
   * With trackVisibility, say background() as soon as the page is hidden (for phones, where the system may
   * kill a hidden page's socket at any time), instead of idle after idleAfterMs. Default false.
   */
  backgroundOnHide?: boolean;
  /** Connect at once. Default true. */
  connect?: boolean;
  /** The WebSocket constructor. Default globalThis.WebSocket. */
  WebSocket?: WebSocketConstructor;
}

/** One connection to greendot, kept open across network trouble, gateway restarts and hidden tabs. */
export declare class GreenDot {
  constructor(options: Options);
  /** The connection state. */
  readonly state: State;
  /** The user's own true status and live device count; null before the first self frame. */
  readonly self: Self | null;
  /** The hello frame of the open connection; null when not open. */
  readonly hello: Hello | null;
  /** The status chosen with setStatus (or options.status), re-sent after every reconnect. */
  readonly chosenStatus: ChosenStatus | undefined;
  /** The ids this client watches. */
  readonly subscriptions: string[];
  /** The rooms this client is in or joining. */
  readonly rooms: Room[];

  on(event: "change", fn: (userId: string, presence: Presence) => void): () => void;
  on(event: "self", fn: (self: Self) => void): () => void;
  on(event: "state", fn: (state: State, detail: StateDetail) => void): () => void;
  on(event: "denied", fn: (denial: Denial) => void): () => void;
  on(event: "error", fn: (error: ServerError) => void): () => void;
  /** Calls fn whenever a watched user's presence changes. Returns a function that removes fn. */
  onChange(fn: (userId: string, presence: Presence) => void): () => void;
  /** Calls fn when the user's own status or device count changes. */
  onSelf(fn: (self: Self) => void): () => void;
  /** Calls fn on every connection state change. */
  onState(fn: (state: State, detail: StateDetail) => void): () => void;
  /** Calls fn when a subscription is refused or revoked; the user is no longer watched. */
  onDenied(fn: (denial: Denial) => void): () => void;
  /** Calls fn for error frames and client failures. */
  onError(fn: (error: ServerError) => void): () => void;

  /** The last known presence of a watched user. */
  presence(userId: string): Presence | undefined;
  /** Every known presence, by user id (a copy). */
  presences(): Map<string, Presence>;

  /** Opens the connection if it is new, suspended or waiting to retry. Throws an Error once the client is closed. */
  connect(): void;
  /** Closes for good. */
  close(): void;
  /**
   * Starts watching users, now and after every reconnect; resolves with the
   * first answer. Throws a TypeError for an id that is not a user id.
   * Requests wait in the client while 8 wait at the gateway, and one the
   * gateway refuses for now (rate_limited, unavailable) is sent again.
   * Rejects when the client closes first, or when another error frame
   * answers it (an Error with that frame's code as its code).
   */
  subscribe(userIds: string | Iterable<string>): Promise<SubscribeResult>;
  /** Stops watching users. */
  unsubscribe(userIds: string | Iterable<string>): void;
  /**
   * Says the app went to the background: the user stays away, not offline, for graceMs (at most the
   * gateway's --background-grace) after the socket closes or dies. Said again on reconnects until activity.
   */
  background(graceMs?: number): void;
  /** Chooses the user's status for all of their devices. Throws a TypeError for another value. */
  setStatus(status: ChosenStatus): void;
  /**
   * Sets the user's custom status for all of their devices (text at most 100 characters, emoji at
   * most 16), cleared by the server at expiresAt if given; empty text and emoji clear it. Throws a
   * TypeError for values of the wrong type.
   */
  setCustomStatus(text?: string, emoji?: string, expiresAt?: Date | number): void;
  /**
   * Joins a room with this connection's meta, now and after every
   * reconnect; for a room already joined, returns the same Room (with the
   * meta given, if any). Throws a TypeError for a bad room id or meta, and
   * an Error once the client is closed.
   */
  room(id: string, meta?: RoomMeta): Room;
  /** Gives a fresh token to the open connection, and to later ones unless options.token is a function (which later ones call). */
  setToken(token: string): void;
  /** Sends one protocol message as it is; reports whether the connection was open. */
  send(message: { type: string; [field: string]: unknown }): boolean;
}

/** The statuses a user may choose. */
export declare const STATUSES: readonly ChosenStatus[];
/** The connection states. */
export declare const STATES: readonly State[];
/** The most user ids the gateway takes in one subscribe message. */
export declare const MAX_SUBSCRIBE_IDS: number;
/** The largest client message the gateway takes by default, in bytes. */
export declare const MAX_MESSAGE_BYTES: number;
/** The largest room meta, in bytes of JSON. */
export declare const MAX_META_BYTES: number;
/** The largest signal data the client sends, in bytes of JSON. */
export declare const MAX_SIGNAL_BYTES: number;
/** Room.typing() sends at most one frame per this many ms. */
export declare const TYPING_INTERVAL_MS: number;
/** How long a signal lasts when the server does not say. */
export declare const SIGNAL_EXPIRES_MS: number;
/** The default options. */
export declare const DEFAULTS: Readonly<Required<Pick<Options,
  "backoffBaseMs" | "backoffMaxMs" | "drainJitterMs" | "stableAfterMs" | "idleAfterMs" |
  "closeAfterMs" | "activityIntervalMs" | "trackVisibility" | "connect">>>;

/** A random delay from 0 up to min(maxMs, baseMs * 2^attempt): exponential backoff with full jitter. */
export declare function backoffDelay(attempt: number, baseMs: number, maxMs: number, random?: () => number): number;
/** Whether s is a user id: 1 to 64 characters of A-Z a-z 0-9 _ -. */
export declare function validUserId(s: unknown): s is string;
/** Whether s is a room id: 1 to 128 characters of A-Z a-z 0-9 _ - and :, other than lease_ended. */
export declare function validRoomId(s: unknown): s is string;
/** Splits ids into messages the gateway takes (at most 100 ids and 4 KiB each). */
export declare function subscribeChunks(ids: Iterable<string>, type?: string): string[][];

/** A clock, replaceable in tests. */
export interface Clock {
  now(): number;
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(id: unknown): void;
}

/** Calls fn at most once per interval: at once, or once at the end of the window. */
export declare class Throttle {
  constructor(fn: () => void, intervalMs: number, clock?: Clock);
  /** Whether a folded call waits for the end of the window. */
  readonly pending: boolean;
  call(): void;
  cancel(): void;
  reset(): void;
}
