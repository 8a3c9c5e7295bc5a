package cli

import (
	"context"
	"log/slog"
	"time"

	"github.com/capvend/capvend/ledger"
)

// resultPruneEvery is how often serve prunes the stored answers past
// ledger.results_retention (and once at start).
const resultPruneEvery = 10 * time.Minute

// pruneResults replaces, at start and then every resultPruneEvery until
// ctx ends, the stored answers older than retention by their hash record
// (ledger.Prune: bounded batches, one transaction each, with a pause
// between them so the calls being served get the writer).
func pruneResults(ctx context.Context, l *ledger.Ledger, retention time.Duration, log *slog.Logger) {
	t := time.NewTicker(resultPruneEvery)
	defer t.Stop()
	for {
		st, err := l.Prune(ctx, time.Now().Add(-retention), 0)
		if err != nil && ctx.Err() == nil {
			log.Warn("pruning stored answers failed", "err", err)
		}
		if !st.Zero() {
			log.Info("stored answers past ledger.results_retention replaced by their hash record",
				"results", st.Results, "replies", st.Replies, "bytes", st.Bytes, "retention", retention.String())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// pruneReplies deletes, every hour until ctx ends, the stored answers to
// Nostr requests older than twice the window, and with claims their
// claims: their replays are refused as too old anyway.
func pruneReplies(ctx context.Context, l *ledger.Ledger, window time.Duration, claims bool, log *slog.Logger) {
	t := time.NewTicker(time.Hour)
	defer t.Stop()
	for {
		if n, err := l.PruneReplies(ctx, time.Now().Add(-2*window)); err != nil && ctx.Err() == nil {
			log.Warn("pruning stored Nostr replies failed", "err", err)
		} else if n > 0 {
			log.Debug("pruned stored Nostr replies", "n", n)
		}
		if claims {
			if n, err := l.PruneRequestClaims(ctx, time.Now().Add(-2*window)); err != nil && ctx.Err() == nil {
				log.Warn("pruning Nostr request claims failed", "err", err)
			} else if n > 0 {
				log.Debug("pruned Nostr request claims", "n", n)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
