#!/bin/sh
# The capvend package's prerm: stop capvend before its binary goes (it
# drains calls in flight first). An upgrade leaves it running: postinst
# restarts it on the new binary.
set -e
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
	systemctl disable --now capvend.service || true
fi
exit 0
