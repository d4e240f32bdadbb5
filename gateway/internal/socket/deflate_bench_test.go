package socket

import (
	"bytes"
	"compress/flate"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"strconv"
	"testing"

	"github.com/gobwas/ws"

	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
)

// The figures of docs/BENCHMARKS.md's permessage-deflate section:
//
//	go test ./gateway/internal/socket -run '^$' -bench 'Deflate|Inflate|ContextTakeover' -benchmem -count 5

// userIDs are the kinds of user ids an app may have, which decide much of
// how well a presence_init compresses: what is left of it once its
// repeated keys and statuses are compressed is mostly its ids' entropy.
var userIDs = []struct {
	name string
	id   func(rng *rand.Rand) string
}{
	// 22 random characters, as nuid makes them: the hardest to compress.
	{"nuid", func(rng *rand.Rand) string {
		const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
		id := make([]byte, 22)
		for j := range id {
			id[j] = alphabet[rng.IntN(len(alphabet))]
		}
		return string(id)
	}},
	{"uuid", func(rng *rand.Rand) string {
		return fmt.Sprintf("%08x-%04x-4%03x-%04x-%012x", rng.Uint32(), rng.IntN(1<<16), rng.IntN(1<<12), 0x8000|rng.IntN(1<<14), rng.Int64N(1<<48))
	}},
	// A 64-bit snowflake, as Discord's and Twitter's.
	{"snowflake", func(rng *rand.Rand) string { return strconv.FormatInt(1<<60+rng.Int64N(1<<58), 10) }},
	// A database's numeric key.
	{"numeric", func(rng *rand.Rand) string { return strconv.Itoa(1000000 + rng.IntN(9000000)) }},
}

// presenceInit returns the JSON of a presence_init of n users, as a
// gateway writes it, with ids made by id (nuid's when nil): 6 in 10
// offline with a last seen time in the past month, 3 online on one or two
// platforms, 1 away with its app in the background.
func presenceInit(tb testing.TB, n int, id func(*rand.Rand) string) []byte {
	tb.Helper()
	if id == nil {
		id = userIDs[0].id
	}
	rng := rand.New(rand.NewPCG(1, 2))
	users := make([]presence.Presence, n)
	for i := range users {
		p := presence.Presence{UserID: id(rng)}
		platforms := ""
		switch r := rng.IntN(10); {
		case r < 6:
			p.Status, p.LastSeen = presence.Offline, 1796600000+rng.Int64N(86400*30)
		case r < 8:
			p.Status, platforms = presence.Online, `{"web":"active"}`
		case r < 9:
			p.Status, platforms = presence.Online, `{"web":"idle","mobile":"active"}`
		default:
			p.Status, platforms = presence.Away, `{"mobile":"background"}`
		}
		if platforms != "" {
			if err := json.Unmarshal([]byte(platforms), &p.Platforms); err != nil {
				tb.Fatal(err)
			}
		}
		users[i] = p
	}
	b, err := json.Marshal(protocol.PresenceInit{Type: protocol.TypePresenceInit, ID: "s1", Users: users})
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// BenchmarkDeflatePresenceInit: the CPU of compressing a presence_init of
// 500 users as a socket with deflate writes it (per message, no context
// taken over), and its size on the wire against the uncompressed frame's;
// at the level used (BestSpeed) and, for comparison, the default level.
func BenchmarkDeflatePresenceInit(b *testing.B) {
	for _, ids := range userIDs {
		msg := presenceInit(b, 500, ids.id)
		for _, tc := range []struct {
			name  string
			level int
		}{{"level=1", flate.BestSpeed}, {"level=6", flate.DefaultCompression}} {
			b.Run("ids="+ids.name+"/"+tc.name, func(b *testing.B) {
				w, _ := flate.NewWriter(nil, tc.level)
				var buf bytes.Buffer
				n := 0
				b.SetBytes(int64(len(msg)))
				b.ReportAllocs()
				for range b.N {
					buf.Reset()
					if tc.level == DeflateLevel {
						n = len(Compress(&buf, msg))
						continue
					}
					w.Reset(&buf)
					_, _ = w.Write(msg)
					_ = w.Flush()
					n = buf.Len() - len(deflateTail)
				}
				plain := len(msg) + ws.HeaderSize(ws.Header{Length: int64(len(msg))})
				wire := n + ws.HeaderSize(ws.Header{Length: int64(n)})
				b.ReportMetric(float64(plain), "plain-B")
				b.ReportMetric(float64(wire), "wire-B")
				b.ReportMetric(float64(plain)/float64(wire), "ratio")
			})
		}
	}
}

// BenchmarkInflatePresenceInit: the CPU of a socket's decoder taking a
// compressed presence_init-sized client message (a client's messages are
// at most the message size limit; this is the cost per inflated byte).
func BenchmarkInflatePresenceInit(b *testing.B) {
	msg := presenceInit(b, 500, nil)
	wire := rawFrame(b, ws.OpText, true, true, compressed(b, string(msg)))
	buf := make([]byte, len(wire))
	var d Decoder
	d.Deflate()
	var sink countSink
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	for range b.N {
		copy(buf, wire)
		if err := d.Decode(buf, 1<<20, &sink); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkContextTakeoverMemory: what an idle connection with deflate
// holds under each choice of context takeover, measured as the heap that
// 1,000 connections' flate state holds after each sent and received one
// message. With context takeover (either way) a connection keeps its
// flate writer (compressor) and reader (window) from message to message;
// without it, the choice the gateway makes, it holds none: both are
// pooled, taken for one message and given back.
func BenchmarkContextTakeoverMemory(b *testing.B) {
	msg := presenceInit(b, 50, nil)
	z := compressed(b, string(msg))
	const conns = 1000
	// Two collections: the first moves what the pools hold to their victim
	// caches, the second frees it, so that what is left is what the
	// connections hold. (A pool holds at most about one writer and one
	// reader per P between collections, whatever the connections: a fixed
	// cost of about 1.3 MB a P while messages are compressed.)
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	b.Run("takeover", func(b *testing.B) {
		for range b.N {
			type state struct {
				w *flate.Writer
				r io.ReadCloser
			}
			kept := make([]state, conns)
			before := heap()
			for i := range kept {
				w, _ := flate.NewWriter(io.Discard, DeflateLevel)
				_, _ = w.Write(msg)
				_ = w.Flush()
				r := flate.NewReader(bytes.NewReader(append(bytes.Clone(z), deflateTail...)))
				_, _ = io.Copy(io.Discard, r)
				kept[i] = state{w, r}
			}
			b.ReportMetric(float64(heap()-before)/conns, "B/conn")
			runtime.KeepAlive(kept)
		}
	})
	b.Run("no_takeover", func(b *testing.B) {
		for range b.N {
			socks := make([]Decoder, conns)
			wire := rawFrame(b, ws.OpText, true, true, z)
			buf := make([]byte, len(wire))
			var sink countSink
			var out bytes.Buffer
			before := heap()
			for i := range socks {
				socks[i].Deflate()
				out.Reset()
				Compress(&out, msg)
				copy(buf, wire)
				if err := socks[i].Decode(buf, 1<<20, &sink); err != nil {
					b.Fatal(err)
				}
			}
			after := heap()
			held := 0.0
			if after > before {
				held = float64(after-before) / conns
			}
			b.ReportMetric(held, "B/conn")
			runtime.KeepAlive(socks)
		}
	})
}
