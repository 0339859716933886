#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, from Debian's packages, for `make test-slurm`.
# Needs root and apt. Installs slurm-wlm and munge if missing, writes a munge key and a slurm.conf
# with this host's CPUs and memory, starts munged, slurmctld and slurmd (niced: the test shares
# the machine), and waits for the node to be idle. No accounting database: the Snakemake SLURM
# plugin reads job states with squeue (MinJobAge keeps finished jobs visible for an hour) and
# finished jobs are also logged by jobcomp/filetxt. Stop it with tests/slurm/stop_cluster.sh.
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "start_cluster.sh: needs root (apt-get, daemons)" >&2; exit 1; }

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurm-wlm munge
fi

# munge: one key shared by every daemon and client of the cluster.
install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
install -d -o munge -g munge -m 0755 /run/munge
[ -s /etc/munge/munge.key ] || mungekey --create --keyfile /etc/munge/munge.key
chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged
munge -n | unmunge >/dev/null

host=$(hostname -s)
node=$(slurmd -C | head -1)            # NodeName=<host> CPUs=... RealMemory=... of this machine
install -d -m 0755 /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=rla-test
SlurmctldHost=${host}
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
ReturnToService=2
MpiDefault=none
MinJobAge=3600
KillWait=30
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=/var/log/slurm/jobcomp.log
${node}
PartitionName=debug Nodes=${host} Default=YES MaxTime=INFINITE State=UP
CONF

pgrep -x slurmctld >/dev/null || nice -n 10 slurmctld
pgrep -x slurmd >/dev/null || nice -n 10 slurmd
for _ in $(seq 60); do
  state=$(sinfo -h -n "$host" -o %t 2>/dev/null || true)
  case "$state" in idle|mix|alloc) echo "slurm: node $host $state"; exit 0;; esac
  [ "$state" = "down" ] || [ "$state" = "drain" ] && scontrol update nodename="$host" state=resume || true
  sleep 1
done
echo "start_cluster.sh: node $host did not become idle (state: ${state:-none}); see /var/log/slurm" >&2
exit 1
