// Package durable runs the life of a process that consumes a JetStream KV
// bucket's stream through a durable consumer shared by all its instances:
// the reaper (presence_conns) and the fanout (presence_status).
//
// A Consumer's Run goes through the same steps for both:
//
//  1. open the buckets (presence.Open), creating missing ones;
//  2. create the durable consumer, or bring its configuration up to date;
//  3. run the process's preparation, if it has one (the reaper's start-up
//     sweep), so that ready means ready;
//  4. become ready;
//  5. start the process's admin micro service;
//  6. start the process's work, consume, and start its loops;
//
// Until it is ready, Ready's error says which step it waits for, with the
// last failure of a step tried again, and the preparation's progress when
// the process tells it (Config.Preparing).
//
// While it runs, a consumer that goes (deleted by an operator, or lost by
// the cluster), and would otherwise never deliver again, is created again
// and read from anew; the process is not ready until it is.
//
// When its context is canceled it undoes those steps in reverse: it stops
// being ready, stops the admin service (waiting for requests being
// handled), stops the loops, drains the consumer (the messages handed out
// are handled), then lets the workers finish what they hold. Run starts
// every goroutine the process needs and returns only after all of them
// have exited.
//
// The package holds no knowledge of what a message means: the process
// gives the steps that are its own as functions in Config.
package durable
