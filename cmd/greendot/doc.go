// Command greendot runs greendot's processes and operator tools.
//
//	greendot standalone            everything in one process, with an embedded NATS server
//	greendot gateway               the WebSocket and HTTP gateway
//	greendot reaper                the ends of gateway leases to offline
//	greendot fanout                status changes to presence events
//	greendot graph ...             follow, unfollow, privacy and show in the social graph
//
// Every flag can also be set with an environment variable GREENDOT_<FLAG>
// (--nats-url is GREENDOT_NATS_URL), or GREENDOT_<KIND>_<FLAG> for a flag
// of one process kind (the reaper's --ack-wait is GREENDOT_REAPER_ACK_WAIT);
// docs/cli.md lists them all. The
// command exits with 0 after a clean shutdown (SIGINT or SIGTERM) and with
// 1, after printing a one-line error, on bad flags or a failure.
package main
