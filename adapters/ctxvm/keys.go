package ctxvm

import (
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip19"
)

// validSecretKey says whether sk is 64 lowercase-or-uppercase hex
// characters of a non-zero key.
func validSecretKey(sk string) bool {
	b, err := hex.DecodeString(sk)
	if err != nil || len(b) != 32 {
		return false
	}
	for _, c := range b {
		if c != 0 {
			return true
		}
	}
	return false
}

// LoadSecretKey reads a secret key from path: an nsec1… (NIP-19) or 64 hex
// characters, surrounded by white space at most. It returns the key as
// lowercase hex. Errors name the path, never the content.
func LoadSecretKey(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("nostr key: %w", err)
	}
	sk, err := ParseSecretKey(string(b))
	if err != nil {
		return "", fmt.Errorf("nostr key %s: %w", path, err)
	}
	return sk, nil
}

// ParseSecretKey parses an nsec1… or 64-hex secret key (white space around
// it is ignored) and returns it as lowercase hex. The error never contains
// the input.
func ParseSecretKey(s string) (string, error) {
	s = strings.TrimSpace(s)
	bad := errors.New("not an nsec1… or 64-hex secret key")
	if strings.HasPrefix(s, "nsec1") {
		prefix, v, err := nip19.Decode(s)
		if err != nil || prefix != "nsec" {
			return "", bad
		}
		hexKey, ok := v.(string)
		if !ok {
			return "", bad
		}
		s = hexKey
	}
	s = strings.ToLower(s)
	if !validSecretKey(s) {
		return "", bad
	}
	if _, err := nostr.GetPublicKey(s); err != nil {
		return "", bad
	}
	return s, nil
}

// ParsePublicKey reads an npub1… (NIP-19) or 64-hex pubkey and returns it as
// lowercase hex (white space around it is ignored).
func ParsePublicKey(s string) (string, error) {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "npub1") {
		prefix, v, err := nip19.Decode(s)
		if err != nil || prefix != "npub" {
			return "", errors.New("not an npub")
		}
		s, _ = v.(string)
	}
	if b, err := hex.DecodeString(s); err != nil || len(b) != 32 {
		return "", errors.New("not 64 hex characters")
	}
	return strings.ToLower(s), nil
}
