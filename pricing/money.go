package pricing

import (
	"fmt"
	"math"
	"strconv"
)

// Msat is an amount of money in millisatoshis. Money is never a float.
type Msat int64

// MsatPerSat is the number of millisatoshis in a satoshi.
const MsatPerSat = 1000

// Sats returns m in whole satoshis, rounded down.
func (m Msat) Sats() int64 { return int64(m) / MsatPerSat }

// SatsCeil returns m in whole satoshis, rounded up: what a client must pay
// where a protocol only speaks sats.
func (m Msat) SatsCeil() int64 {
	s := int64(m) / MsatPerSat
	if int64(m)%MsatPerSat > 0 {
		s++
	}
	return s
}

// FromSats converts whole satoshis to Msat; it fails on negative amounts and
// on amounts that would overflow.
func FromSats(sats int64) (Msat, error) {
	if sats < 0 {
		return 0, fmt.Errorf("negative amount %d sat", sats)
	}
	if sats > math.MaxInt64/MsatPerSat {
		return 0, fmt.Errorf("amount %d sat is too large", sats)
	}
	return Msat(sats * MsatPerSat), nil
}

// String formats m as sats with millisatoshi precision, e.g. "21.000 sat".
func (m Msat) String() string { return string(m.AppendSats(nil)) + " sat" }

// AppendSats appends m as a decimal number of sats with exactly three
// fractional digits ("-0.001", "21.000") to b. It is exact: no float
// conversion happens.
func (m Msat) AppendSats(b []byte) []byte {
	v := int64(m)
	if v < 0 {
		b = append(b, '-')
	}
	// Work on the magnitude as uint64 so MinInt64 is handled.
	u := uint64(v)
	if v < 0 {
		u = uint64(-(v + 1)) + 1
	}
	b = strconv.AppendUint(b, u/MsatPerSat, 10)
	frac := u % MsatPerSat
	return append(b, '.', byte('0'+frac/100), byte('0'+frac/10%10), byte('0'+frac%10))
}
