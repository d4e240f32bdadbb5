package gateway

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// certFiles is the gateway's TLS certificate, from Config.TLSCertFile and
// TLSKeyFile, read again when either file changes: each TLS handshake
// takes the newest one read, and the sockets open keep theirs.
type certFiles struct {
	certFile, keyFile string
	log               *slog.Logger
	// every is how often the files are looked at, at most: a handshake
	// after that looks.
	every time.Duration

	mu      sync.Mutex
	cert    *tls.Certificate
	stamp   [2]fileStamp
	checked time.Time
}

// fileStamp is what says a file changed: its size and modification time.
type fileStamp struct {
	size int64
	mod  time.Time
}

func stampOf(path string) (fileStamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, err
	}
	return fileStamp{fi.Size(), fi.ModTime()}, nil
}

// loadCertFiles reads the certificate and key, or says what is wrong with
// them.
func loadCertFiles(certFile, keyFile string, every time.Duration, log *slog.Logger) (*certFiles, error) {
	c := &certFiles{certFile: certFile, keyFile: keyFile, every: every, log: log}
	if err := c.reload(time.Now()); err != nil {
		return nil, err
	}
	return c, nil
}

// reload reads the files if either changed since they were read; the
// caller holds c.mu, or is loadCertFiles.
func (c *certFiles) reload(now time.Time) error {
	c.checked = now
	var stamp [2]fileStamp
	for i, path := range []string{c.certFile, c.keyFile} {
		st, err := stampOf(path)
		if err != nil {
			return fmt.Errorf("TLS: %w", err)
		}
		stamp[i] = st
	}
	if c.cert != nil && stamp == c.stamp {
		return nil
	}
	cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		return fmt.Errorf("TLS certificate %s and key %s: %w", c.certFile, c.keyFile, err)
	}
	first := c.cert == nil
	c.cert, c.stamp = &cert, stamp
	if !first {
		c.log.Info("TLS certificate read again", "cert", c.certFile)
	}
	return nil
}

// get is tls.Config.GetCertificate: the newest certificate, the files
// looked at first if they were not within every. A certificate that
// cannot be read keeps the one before, and is logged.
func (c *certFiles) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := time.Now(); now.Sub(c.checked) >= c.every {
		if err := c.reload(now); err != nil {
			c.log.Error("TLS certificate not read again: the one before is kept", "err", err)
		}
	}
	return c.cert, nil
}

// tlsConfig is the TLS configuration of a gateway serving c's
// certificate: TLS 1.2 at least, HTTP/1.1 (WebSockets are upgraded from
// it).
func (c *certFiles) tlsConfig() *tls.Config {
	return &tls.Config{GetCertificate: c.get, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}}
}
