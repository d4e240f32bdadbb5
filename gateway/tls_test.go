package gateway_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/system/systest"
)

// selfSigned writes a certificate for 127.0.0.1 named name, and its key,
// to dir, and returns their paths and the certificate.
func selfSigned(t *testing.T, dir, name string) (certFile, keyFile string, cert *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	if cert, err = x509.ParseCertificate(der); err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, cert
}

// served returns the name of the certificate the gateway at addr serves.
func served(t *testing.T, addr string) string {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true}) // the name is what is looked at
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].Subject.CommonName
}

// TestTLS: with a certificate and key, the gateway serves wss:// and
// https:// on its address; new files (a renewed certificate) are served
// to the connections that come after, while the sockets open keep going;
// a certificate that cannot be read keeps the one before; files that
// cannot be read at the start stop it.
func TestTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certFile, keyFile, first := selfSigned(t, dir, "first")
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{TLSCertFile: certFile, TLSKeyFile: keyFile, TLSReload: 20 * time.Millisecond}})
	gw := sys.Gateway()
	sys.Mutual("alice", "bob")
	roots := x509.NewCertPool()
	roots.AddCert(first)
	tlsc := &tls.Config{RootCAs: roots}
	dial := func(user string) *client.Conn {
		t.Helper()
		c, err := client.Dial(context.Background(), "wss://"+gw.Addr+"/ws?user="+user, client.Options{TLSConfig: tlsc})
		if err != nil {
			t.Fatalf("dial wss as %s: %v", user, err)
		}
		t.Cleanup(func() { _ = c.Abort() })
		return c
	}
	alice := dial("alice")
	defer systest.KeepAlive(alice, systest.Heartbeat)()
	if err := alice.Subscribe("s", "bob"); err != nil {
		t.Fatal(err)
	}
	systest.AwaitStatus(t, alice, "bob", presence.Offline)
	https := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsc}}
	resp, err := https.Get("https://" + gw.Addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET https /healthz: %s", resp.Status)
	}
	if _, err := http.Get("http://" + gw.Addr + "/healthz"); err == nil {
		t.Error("plain HTTP answered on a TLS gateway")
	}

	// A renewed certificate, written over the files as a renewal does.
	c2, k2, second := selfSigned(t, dir, "second")
	roots.AddCert(second)
	for _, mv := range [][2]string{{k2, keyFile}, {c2, certFile}} {
		if err := os.Rename(mv[0], mv[1]); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for served(t, gw.Addr) != "second" {
		if time.Now().After(deadline) {
			t.Fatal("the renewed certificate not served after 5s")
		}
		time.Sleep(25 * time.Millisecond) // polling the reload, bounded by deadline
	}
	// The socket opened under the first certificate still sees changes.
	dial("bob")
	systest.AwaitStatus(t, alice, "bob", presence.Online)

	// A broken file keeps the certificate before.
	if err := os.WriteFile(certFile, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if name := served(t, gw.Addr); name != "second" {
			t.Errorf("after a broken certificate file: %q served, want the one before", name)
		}
	}

	// At the start, files that cannot be read stop the gateway.
	g, err := gateway.New(sys.NC, gateway.Config{DevAuth: true, TLSCertFile: certFile, TLSKeyFile: keyFile})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Serve(context.Background(), ln); err == nil || !strings.Contains(err.Error(), "TLS certificate") {
		t.Errorf("Serve with a broken certificate: %v", err)
	}
	if _, err := gateway.New(sys.NC, gateway.Config{DevAuth: true, TLSCertFile: certFile}); err == nil || !strings.Contains(err.Error(), "both a certificate file and a key file") {
		t.Errorf("a certificate without a key: %v", err)
	}
}
