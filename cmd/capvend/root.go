package main

func rootCommand() *command {
	return &command{
		Name:    "capvend",
		Summary: "capvend sells MCP tool calls for sats over Nostr (ContextVM/DVMCP) and MCP HTTP, paid by Lightning (LND) or Cashu.",
		Help: `Commands that read the configuration take --config FILE; without it they
use $CAPVEND_CONFIG, else ./capvend.yaml. Start with 'capvend init'.`,
		Subs: []*command{
			demoCommand(),
			initCommand(),
			serveCommand(),
			unannounceCommand(),
			versionCommand(),
			ledgerCommand(),
			testnetCommand(),
			cashuCommand(),
		},
	}
}
