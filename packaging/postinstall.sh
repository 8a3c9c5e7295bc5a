#!/bin/sh
# The capvend package's postinst: the capvend system user, its state
# directory, and systemd told about the unit. Safe to run again (an
# upgrade or a reinstall runs it with the user already there).
set -e

if ! getent group capvend >/dev/null; then
	groupadd --system capvend
fi
if ! getent passwd capvend >/dev/null; then
	useradd --system --gid capvend --home-dir /var/lib/capvend --no-create-home \
		--shell /usr/sbin/nologin --comment "capvend (sells MCP tool calls for sats)" capvend
fi
# systemd creates it too (StateDirectory=capvend), but doctor and the
# ledger commands run before the first start, and without systemd.
install -d -o capvend -g capvend -m 0750 /var/lib/capvend

if [ -d /run/systemd/system ]; then
	systemctl daemon-reload || true
	# An upgrade restarts a running capvend (it drains its calls first);
	# a first install starts nothing: the example configuration needs
	# your LND node and MCP servers before it can serve.
	if [ "$1" = configure ] && [ -n "$2" ]; then
		systemctl try-restart capvend.service || true
	fi
fi
if [ "$1" = configure ] && [ -z "$2" ]; then
	echo "capvend: edit /etc/capvend/capvend.yaml, check it with 'sudo -u capvend capvend doctor --config /etc/capvend/capvend.yaml', then 'systemctl enable --now capvend'"
fi
exit 0
