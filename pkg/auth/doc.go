// Package auth verifies the JSON Web Tokens that prove who a gateway client
// is (docs/protocol.md, "Connecting").
//
// A Verifier holds one key, or a KeySet: the keys of a JWK Set read from a
// file or a URL, chosen by each token's kid and read again as they rotate.
// A key is an HMAC secret (HS256, HS384, HS512) or a public key, in PEM
// when it is the only one (RSA: RS256, RS384, RS512, PS256, PS384, PS512;
// ECDSA: the one ES algorithm of its curve; Ed25519: EdDSA). A token is accepted
// only when it is signed with an algorithm of that key's kind, so "none" is
// never accepted and a public key is never used as an HMAC secret. The
// token's "sub" claim is the user id and its "exp" claim is required; "iss"
// and "aud" are checked when the Verifier is configured with them, "nbf"
// and "iat" whenever they are present.
//
// Verifier implements the gateway's TokenVerifier. Errors wrap one of the
// sentinels in errors.go, so callers can tell an expired token from a forged
// one, and their text is fit to show to the client.
package auth
