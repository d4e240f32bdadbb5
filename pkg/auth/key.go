package auth

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"

	"github.com/golang-jwt/jwt/v5"
)

// MinRSABits is the smallest RSA modulus New accepts.
const MinRSABits = 2048

// keyKind is the kind of a verification key; it decides which signing
// algorithms a token may use.
type keyKind int

const (
	kindHMAC keyKind = iota + 1
	kindRSA
	kindECDSA
	kindEd25519
)

func (k keyKind) String() string {
	switch k {
	case kindHMAC:
		return "HMAC secret"
	case kindRSA:
		return "RSA public key"
	case kindECDSA:
		return "ECDSA public key"
	case kindEd25519:
		return "Ed25519 public key"
	}
	return "unknown key"
}

// algorithms returns the algorithms a key of this kind verifies. An ECDSA
// key verifies only the algorithm of its curve.
func (k keyKind) algorithms(key any) []string {
	switch k {
	case kindHMAC:
		return []string{"HS256", "HS384", "HS512"}
	case kindRSA:
		return []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"}
	case kindECDSA:
		switch key.(*ecdsa.PublicKey).Curve {
		case elliptic.P256():
			return []string{"ES256"}
		case elliptic.P384():
			return []string{"ES384"}
		case elliptic.P521():
			return []string{"ES512"}
		}
	case kindEd25519:
		return []string{"EdDSA"}
	}
	return nil
}

// matches reports whether a signing method is implemented for keys of this
// kind, so that a method registered under a misleading name is refused too.
func (k keyKind) matches(m jwt.SigningMethod) bool {
	switch m.(type) {
	case *jwt.SigningMethodHMAC:
		return k == kindHMAC
	case *jwt.SigningMethodRSA, *jwt.SigningMethodRSAPSS:
		return k == kindRSA
	case *jwt.SigningMethodECDSA:
		return k == kindECDSA
	case *jwt.SigningMethodEd25519:
		return k == kindEd25519
	}
	return false
}

// parsePublicKey reads the one public key of a PEM file.
func parsePublicKey(data []byte) (any, keyKind, error) {
	var (
		key   any
		found string
	)
	rest := data
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		var (
			k   any
			err error
		)
		switch block.Type {
		case "PUBLIC KEY":
			k, err = x509.ParsePKIXPublicKey(block.Bytes)
		case "RSA PUBLIC KEY":
			k, err = x509.ParsePKCS1PublicKey(block.Bytes)
		case "CERTIFICATE":
			var cert *x509.Certificate
			if cert, err = x509.ParseCertificate(block.Bytes); err == nil {
				k = cert.PublicKey
			}
		case "EC PARAMETERS":
			continue // written by `openssl ecparam` next to a key
		default:
			if strings.Contains(block.Type, "PRIVATE KEY") {
				return nil, 0, fmt.Errorf("PEM block %q is a private key: give the public key (openssl pkey -pubout) or a certificate", block.Type)
			}
			return nil, 0, fmt.Errorf("PEM block %q: want PUBLIC KEY, RSA PUBLIC KEY or CERTIFICATE", block.Type)
		}
		if err != nil {
			return nil, 0, fmt.Errorf("PEM block %q: %w", block.Type, err)
		}
		if key != nil {
			return nil, 0, fmt.Errorf("more than one key (%s, then %s): give exactly one", found, block.Type)
		}
		key, found = k, block.Type
	}
	if key == nil {
		if strings.TrimSpace(string(data)) == "" {
			return nil, 0, errors.New("the file is empty")
		}
		return nil, 0, errors.New("no PEM block found: want a PEM file with a PUBLIC KEY or CERTIFICATE block")
	}
	return classify(key)
}

// classify checks a public key (or an HMAC secret, as []byte) that
// verifies tokens, and returns it with its kind.
func classify(key any) (any, keyKind, error) {
	switch k := key.(type) {
	case []byte:
		if len(k) < MinSecretLen {
			return nil, 0, fmt.Errorf("HMAC secret is %d bytes: want at least %d", len(k), MinSecretLen)
		}
		return k, kindHMAC, nil
	case *rsa.PublicKey:
		if k.N.BitLen() < MinRSABits {
			return nil, 0, fmt.Errorf("RSA key of %d bits: want at least %d", k.N.BitLen(), MinRSABits)
		}
		return k, kindRSA, nil
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256(), elliptic.P384(), elliptic.P521():
			return k, kindECDSA, nil
		}
		return nil, 0, fmt.Errorf("ECDSA curve %s: want P-256, P-384 or P-521", k.Curve.Params().Name)
	case ed25519.PublicKey:
		return k, kindEd25519, nil
	}
	return nil, 0, fmt.Errorf("unsupported key type %T: want RSA, ECDSA or Ed25519", key)
}
