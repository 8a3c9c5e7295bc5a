package ctxvm

import (
	"encoding/hex"
	"fmt"
	"strings"
)

// accessList is Config.Allow and Config.Deny as sets of lowercase hex
// pubkeys.
type accessList struct {
	allow, deny map[string]bool
}

// newAccessList checks allow and deny (64 hex characters each) and returns
// them as sets. The error names the list and the entry's index.
func newAccessList(allow, deny []string) (accessList, error) {
	var l accessList
	set := func(name string, keys []string) (map[string]bool, error) {
		if len(keys) == 0 {
			return nil, nil
		}
		m := make(map[string]bool, len(keys))
		for i, k := range keys {
			k = strings.ToLower(k)
			if b, err := hex.DecodeString(k); err != nil || len(b) != 32 {
				return nil, fmt.Errorf("ctxvm: %s[%d]: %q is not a 64-hex pubkey", name, i, keys[i])
			}
			m[k] = true
		}
		return m, nil
	}
	var err error
	if l.allow, err = set("Allow", allow); err != nil {
		return l, err
	}
	if l.deny, err = set("Deny", deny); err != nil {
		return l, err
	}
	return l, nil
}

// permits says whether requests of pubkey (hex) are served: it is not
// denied and, when an allowlist is set, allowed.
func (l accessList) permits(pubkey string) bool {
	pubkey = strings.ToLower(pubkey)
	if l.deny[pubkey] {
		return false
	}
	return l.allow == nil || l.allow[pubkey]
}
