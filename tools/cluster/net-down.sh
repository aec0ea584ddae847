#!/usr/bin/env bash
# Remove the multi partition's network namespaces and bridge: exactly what up.sh recorded
# making in $T/run/net, newest first (down.sh calls it; so does up.sh when it could not finish).
T=${T:-${TMPDIR:-/tmp}/perflab-slurm}
[ -f "$T/run/net" ] || exit 0
gone() { if [ "$1" = netns ]; then [ ! -e "/run/netns/$2" ]; else ! ip link show "$2" >/dev/null 2>&1; fi; }
exec 3>&1  # what was removed, to the caller's stdout; what was not, kept in $T/run/net
left=$(tac "$T/run/net" | while read -r kind name; do
  if [ "$kind" = netns ]; then ip netns del "$name"; else ip link del "$name"; fi 2>/dev/null
  if gone "$kind" "$name"; then echo "removed $kind $name" >&3; else echo "$kind $name"; fi
done)
rm -f "$T/run/net.ok"
if [ -n "$left" ]; then  # kept for the next try: what could not be removed now
  echo "$left" | tac > "$T/run/net"
  echo "net-down: could not remove: $(echo "$left" | tr '\n' ' ')" >&2
else
  rm -f "$T/run/net"
fi
