package vend

import "context"

// urgentKey is the context key of Urgent.
type urgentKey struct{}

// Urgent marks ctx as serving money already in motion: a payment that
// arrived, or a request of a known payer (see KnownPayer). The ledger
// serves the reads of such a context on a connection of their own, so
// they do not wait behind a flood's lookups for its shared ones (under
// capvend-flood those waits were most of a paid call's time between its
// payment and its result).
func Urgent(ctx context.Context) context.Context {
	if IsUrgent(ctx) {
		return ctx
	}
	return context.WithValue(ctx, urgentKey{}, true)
}

// IsUrgent reports whether ctx was marked with Urgent.
func IsUrgent(ctx context.Context) bool {
	u, _ := ctx.Value(urgentKey{}).(bool)
	return u
}
