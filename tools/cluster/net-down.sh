#!/usr/bin/env bash
# Remove the multi partition's network namespaces and bridge: exactly what up.sh recorded
# making in $T/run/net, newest first (down.sh calls it; so does up.sh when it could not finish).
T=${T:-${TMPDIR:-/tmp}/perflab-slurm}
[ -f "$T/run/net" ] || exit 0
tac "$T/run/net" | while read -r kind name; do
  if [ "$kind" = netns ]; then ip netns del "$name"; else ip link del "$name"; fi 2>/dev/null && echo "removed $kind $name"
done
rm -f "$T/run/net" "$T/run/net.ok"
