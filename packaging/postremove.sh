#!/bin/sh
# The capvend package's postrm. Nothing of /var/lib/capvend is removed,
# not even on purge: the ledger there is the record of what was earned
# and what is owed, and the Cashu wallet holds bearer ecash. The capvend
# user stays too (it owns those files).
set -e
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload || true
fi
exit 0
