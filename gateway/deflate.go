package gateway

import (
	"github.com/gobwas/httphead"
	"github.com/gobwas/ws/wsflate"
)

// deflateParams are what a gateway answers an offer of permessage-deflate
// (RFC 7692) with: no context takeover either way, which a server may say
// whatever the client offered (§7.1.1.1, §7.1.1.2). Each message is then
// compressed and inflated on its own, with pooled flate state: an idle
// connection holds none, where a context kept from message to message
// costs a connection its compressor and its inflater's window (about 1.2
// MiB, docs/BENCHMARKS.md), 600 times what the rest of it costs. An
// offer with server_max_window_bits (wsflate declines any, as the gateway
// could not keep to a window under the 32 KiB compress/flate always uses)
// and one with an unknown, repeated or invalid parameter are declined
// (§5, §7): the connection goes on uncompressed.
var deflateParams = wsflate.Parameters{ServerNoContextTakeover: true, ClientNoContextTakeover: true}

// negotiateDeflate returns the upgrader's Negotiate for an upgrade, which
// ext then says the outcome of (Accepted).
func negotiateDeflate(ext *wsflate.Extension) func(httphead.Option) (httphead.Option, error) {
	ext.Parameters = deflateParams
	return func(opt httphead.Option) (httphead.Option, error) {
		accept, err := ext.Negotiate(opt)
		if err != nil {
			// A bad offer is declined, not the upgrade: the client may
			// have offered something else next, or nothing.
			return httphead.Option{}, nil
		}
		return accept, nil
	}
}
