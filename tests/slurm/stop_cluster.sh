#!/usr/bin/env bash
# Stop what start_cluster.sh started (by the pid files the daemons wrote); munged keeps running.
for pidfile in /run/slurmd.pid /run/slurmctld.pid; do
  [ -s "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
done
