package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"time"

	"github.com/capvend/capvend/adapters/ctxvm"
)

func unannounceCommand() *command {
	var config, reason string
	var timeout time.Duration
	return &command{
		Name:    "unannounce",
		Summary: "ask the Nostr relays to delete this server's announcements",
		Help: `With nostr.announce: true, 'capvend serve' publishes announcements on the
relays of nostr.relays so that Nostr clients can find the server: ContextVM
kinds 11316-11320 (server, tools, resources, resource templates, prompts),
DVMCP kinds 31316-31319, the NIP-89 kind 31990 and a NIP-65 relay list
(kind 10002). This command withdraws them: signed with the key of
nostr.nsec_file, it publishes one NIP-09 deletion request (kind 5) naming
every announcement (an "a" tag per kind and d tag, a "k" tag per kind, and
an "e" tag per announcement event it finds on the relays) to every relay.

Relays decide whether to honour it; most delete the events. It succeeds
when at least one relay accepted the request, and fails (exit 1) when none
did. Run it with the server stopped, and set nostr.announce: false before
starting it again: otherwise the server publishes its announcements anew.

Example:
  capvend unannounce --config capvend.yaml --reason "moved to a new key"`,
		Flags: func(fs *flag.FlagSet) {
			fs.StringVar(&config, "config", "", "configuration `FILE` (default $CAPVEND_CONFIG, else ./capvend.yaml); uses nostr.relays and nostr.nsec_file")
			fs.StringVar(&reason, "reason", "", "`TEXT` of the deletion request (shown by some clients)")
			fs.DurationVar(&timeout, "timeout", 15*time.Second, "how long to wait for the relays, per step (finding the events, publishing)")
		},
		Run: func(ctx context.Context, e *env, args []string) error {
			if len(args) > 0 {
				return usageError("unannounce takes no arguments (got %q)", args[0])
			}
			if timeout <= 0 {
				return usageError("--timeout must be positive")
			}
			cfg, err := loadConfig(config, e.Getenv)
			if err != nil {
				return err
			}
			if len(cfg.Nostr.Relays) == 0 {
				return errors.New("nostr.relays is empty: no relay to ask")
			}
			if err := checkSecretFile("nostr.nsec_file", cfg.Nostr.NsecFile); err != nil {
				return err
			}
			sk, err := ctxvm.LoadSecretKey(cfg.Nostr.NsecFile)
			if err != nil {
				return fmt.Errorf("nostr.nsec_file: %w", err)
			}
			res, err := ctxvm.Unannounce(ctx, sk, cfg.Nostr.Relays, reason, timeout)
			if err != nil {
				return fmt.Errorf("unannounce: %w", err)
			}
			fmt.Fprintf(e.Stdout, "deletion request %s (%d announcement events found) accepted by %d of %d relay(s):\n",
				res.Event.ID, res.Found, len(res.Accepted), len(cfg.Nostr.Relays))
			for _, r := range cfg.Nostr.Relays {
				status := "refused or unreachable"
				if slices.Contains(res.Accepted, r) {
					status = "accepted"
				}
				fmt.Fprintf(e.Stdout, "  %s: %s\n", r, status)
			}
			if cfg.Nostr.Announce {
				fmt.Fprintln(e.Stderr, "capvend: note: nostr.announce is true: 'capvend serve' will announce the server again; set it to false to stay unannounced")
			}
			return nil
		},
	}
}
