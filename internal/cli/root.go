package cli

func rootCommand() *command {
	return &command{
		Name:    "capvend",
		Summary: "capvend sells MCP tool calls for sats over Nostr (ContextVM/DVMCP) and MCP HTTP, paid by Lightning (LND) or Cashu.",
		Help: `Commands that read the configuration take --config FILE; without it they
use $CAPVEND_CONFIG, else ./capvend.yaml.

New here? 'capvend demo' shows everything working on a local regtest
network in about half a minute (the first run builds btcd and lnd). To
sell your own MCP server: 'capvend init', edit capvend.yaml, then
'capvend serve'. docs/OPERATING.md explains the configuration, real LND
nodes, Cashu mints and Nostr relays; docs/PAYING.md how clients pay.`,
		Subs: []*command{
			demoCommand(),
			initCommand(),
			serveCommand(),
			unannounceCommand(),
			versionCommand(),
			ledgerCommand(),
			testnetCommand(),
			cashuCommand(),
			refundsCommand(),
			creditCommand(),
			l402Command(),
			reconcileCommand(),
			doctorCommand(),
		},
	}
}
