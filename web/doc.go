// Package web serves greendot's browser side: the JavaScript client
// (/greendot.js, an ES module with no build step, and its TypeScript
// declarations /greendot.d.ts) and, in demo mode, the live demo page at /
// with the demo-only endpoints under /demo/api/ that write the follow graph.
//
// The files are embedded in the binary. The folder is also the npm package
// @greendot/client (package.json, greendot.js, greendot.d.ts), so an app
// that bundles its scripts can `npm install` it instead of loading the
// script from the gateway.
//
// The gateway serves Handler for every path its API does not
// (gateway.Config.Static):
//
//	gateway.Config{Static: web.Handler(web.Options{})}                            // the client only
//	gateway.Config{Static: web.Handler(web.Options{Demo: true, Store: store})} // standalone: the demo too
package web
