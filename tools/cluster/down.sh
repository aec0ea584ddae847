#!/usr/bin/env bash
# Stop what up.sh started: cancel every job, then stop the PIDs it recorded (nothing else).
T=${T:-${TMPDIR:-/tmp}/perflab-slurm}
export SLURM_CONF=$T/etc/slurm.conf
if [ -n "$(squeue -h 2>/dev/null)" ]; then
  scancel --full $(squeue -h -o %A) 2>/dev/null
  for _ in $(seq 60); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 1; done
fi
for d in slurmd-n1 slurmd-n2 slurmd slurmctld slurmdbd mariadbd munged; do
  f=$T/run/$d.pid
  [ -f "$f" ] || continue
  p=$(cat "$f")
  if kill -0 "$p" 2>/dev/null; then
    kill "$p"
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$p" 2>/dev/null && kill -9 "$p"
  fi
  rm -f "$f"
  echo "stopped $d ($p)"
done
T=$T bash "$(dirname "$0")/net-down.sh"
