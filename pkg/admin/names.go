package admin

// The micro service names, one per process kind.
const (
	// GatewayService is the micro service of every gateway.
	GatewayService = "greendot-gateway"
	// ReaperService is the micro service of every reaper.
	ReaperService = "greendot-reaper"
	// FanoutService is the micro service of every fanout.
	FanoutService = "greendot-fanout"
	// WebhooksService is the micro service of every webhooks process.
	WebhooksService = "greendot-webhooks"
)

// The endpoint names (as `nats micro info` lists them).
const (
	// InfoEndpoint answers an Info: configuration and load. Every service
	// has it; it is a broadcast endpoint.
	InfoEndpoint = "info"
	// KickEndpoint closes a user's sockets (gateway, broadcast).
	KickEndpoint = "kick"
	// ConnsEndpoint answers a user's status and live connections (gateway,
	// queue).
	ConnsEndpoint = "conns"
	// WatchersEndpoint answers the sockets watching a user (gateway,
	// broadcast).
	WatchersEndpoint = "watchers"
	// SweepEndpoint runs a reaper sweep now (reaper, queue).
	SweepEndpoint = "sweep"
)

// subjectPrefix starts every admin subject. An operator's NATS user needs
// publish permission on "greendot.>" and "$SRV.>"; each process's user
// needs subscribe permission on its own "greendot.<kind>.>" and "$SRV.>".
const subjectPrefix = "greendot."

// The admin subjects.
const (
	// GatewayInfoSubject is answered by every gateway with an Info.
	GatewayInfoSubject = subjectPrefix + "gateway." + InfoEndpoint
	// GatewayKickSubject takes a KickRequest; every gateway closes the
	// user's sockets it holds and answers a KickReply.
	GatewayKickSubject = subjectPrefix + "gateway." + KickEndpoint
	// GatewayConnsSubject takes a UserRequest; one gateway answers a
	// ConnsReply read from presence_status and presence_conns.
	GatewayConnsSubject = subjectPrefix + "gateway." + ConnsEndpoint
	// GatewayWatchersSubject takes a UserRequest; every gateway answers a
	// WatchersReply listing its sockets that watch the user.
	GatewayWatchersSubject = subjectPrefix + "gateway." + WatchersEndpoint
	// ReaperInfoSubject is answered by every reaper with an Info.
	ReaperInfoSubject = subjectPrefix + "reaper." + InfoEndpoint
	// ReaperSweepSubject runs a sweep on one reaper, which answers a
	// SweepReply when it is done.
	ReaperSweepSubject = subjectPrefix + "reaper." + SweepEndpoint
	// FanoutInfoSubject is answered by every fanout with an Info.
	FanoutInfoSubject = subjectPrefix + "fanout." + InfoEndpoint
	// WebhooksInfoSubject is answered by every webhooks process with an
	// Info.
	WebhooksInfoSubject = subjectPrefix + "webhooks." + InfoEndpoint
)
