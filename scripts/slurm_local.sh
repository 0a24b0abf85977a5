#!/usr/bin/env bash
# One-node SLURM cluster on localhost (slurmctld + slurmd + munged), for
# running sbatch/srun/submitit jobs on this machine. Debian/Ubuntu, as root.
#
#   scripts/slurm_local.sh up       install if missing, configure, (re)start, smoke test
#   scripts/slurm_local.sh down     stop the daemons (packages stay installed)
#   scripts/slurm_local.sh status   sinfo + squeue
#
# Works in a container: no systemd (daemons are started directly) and no
# cgroups (proctrack/linuxproc + task/none, so slurmd never touches
# /sys/fs/cgroup and no cgroup.conf is needed). No accounting (no slurmdbd).
# Logs: /var/log/slurm/{slurmctld,slurmd,munged,apt}.log
set -euo pipefail

LOG_DIR=/var/log/slurm
CONF=/etc/slurm/slurm.conf
MUNGE_KEY=/etc/munge/munge.key
# munged refuses a log file under a directory not owned by root or munge, and
# the package makes /var/log/slurm the slurm user's: munged keeps its default
# log, linked as /var/log/slurm/munged.log.
MUNGE_LOG=/var/log/munge/munged.log
NODE=$(hostname -s)

die() { echo "slurm_local: ERROR: $*" >&2; exit 1; }
# Last lines of the daemons' logs, printed before giving up.
show_logs() {
    local f
    for f in "$LOG_DIR"/slurmctld.log "$LOG_DIR"/slurmd.log "$MUNGE_LOG"; do
        [[ -f $f ]] && { echo "--- tail $f" >&2; tail -n 15 "$f" >&2; }
    done
    return 0
}
# Wait up to $2 seconds for command $1 (a string, eval'ed) to succeed.
wait_for() {
    local i
    for ((i = 0; i < $2 * 5; i++)); do eval "$1" && return 0; sleep 0.2; done
    return 1
}
# Stop every process with exactly this name; SIGKILL after 15 s.
stop_daemon() {
    pkill -x "$1" || return 0
    wait_for "! pgrep -x $1 >/dev/null" 15 || { pkill -9 -x "$1" || true; sleep 1; }
}

install_pkgs() {
    local have=1 c
    for c in slurmctld slurmd srun sbatch munged; do command -v "$c" >/dev/null || have=0; done
    ((have)) && return 0
    echo "slurm_local: installing slurm-wlm munge (log: $LOG_DIR/apt.log)"
    local t0=$SECONDS
    export DEBIAN_FRONTEND=noninteractive
    local apt=(apt-get install -y --no-install-recommends slurm-wlm munge)
    # Refresh the package lists only if the install fails (e.g. lists missing).
    if ! "${apt[@]}" >"$LOG_DIR/apt.log" 2>&1; then
        echo "slurm_local: install failed, running apt-get update and retrying"
        apt-get update >>"$LOG_DIR/apt.log" 2>&1 || die "apt-get update failed, see $LOG_DIR/apt.log"
        "${apt[@]}" >>"$LOG_DIR/apt.log" 2>&1 || die "apt-get install failed, see $LOG_DIR/apt.log"
    fi
    echo "slurm_local: packages installed in $((SECONDS - t0)) s"
}

start_munge() {
    # The package's postinst normally creates the key; make one if not.
    if [[ ! -s $MUNGE_KEY ]]; then
        echo "slurm_local: creating $MUNGE_KEY"
        install -d -o munge -g munge -m 0700 /etc/munge
        dd if=/dev/urandom of="$MUNGE_KEY" bs=1024 count=1 status=none
    fi
    chown munge:munge "$MUNGE_KEY"
    chmod 0400 "$MUNGE_KEY"
    # /run is a tmpfs in most containers: the socket dir must be recreated.
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/lib/munge
    install -d -o munge -g munge -m 0700 /var/log/munge
    ln -sfn "$MUNGE_LOG" "$LOG_DIR/munged.log"
    # Keep a munged that answers; otherwise (re)start it as the munge user.
    if munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
        echo "slurm_local: munged already running"
        return 0
    fi
    stop_daemon munged
    rm -f /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock /run/munge/munged.pid
    runuser -u munge -- /usr/sbin/munged --log-file="$MUNGE_LOG" \
        || { show_logs; die "munged failed to start, see $MUNGE_LOG"; }
    wait_for "munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1" 10 \
        || { show_logs; die "munge -n | unmunge fails, see $MUNGE_LOG"; }
}

write_conf() {
    local cpus mem_total mem
    cpus=$(nproc)
    mem_total=$(free -m | awk '/^Mem:/ {print $2}')
    # Leave 10% (at least 512 MB) to the OS: slurmd drains the node if
    # RealMemory is above what it measures itself.
    mem=$((mem_total - (mem_total / 10 > 512 ? mem_total / 10 : 512)))
    ((mem > 0)) || die "too little memory: free -m says $mem_total MB"
    install -d -m 0755 /etc/slurm /var/spool/slurmctld /var/spool/slurmd
    cat >"$CONF" <<EOF
# Written by scripts/slurm_local.sh: one-node cluster on $NODE.
ClusterName=local
# 127.0.0.1: works even where the hostname does not resolve (containers).
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
MpiDefault=none
# No mail on this machine; silences "Configured MailProg is invalid".
MailProg=/bin/true
ReturnToService=2
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
# No cgroups: they are missing or read-only in containers.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
# No slurmdbd: sacct does not work, squeue/scontrol do.
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
# Without a default, a job lacking --mem takes all the node's memory (one job
# at a time); give it 1 GB per CPU instead.
DefMemPerCPU=$((mem / cpus < 1024 ? mem / cpus : 1024))
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
}

# The node's state, once the slurmd started at epoch $1 has registered
# (slurmctld reloads the old state at start and shows it until then).
node_state() {
    local started
    started=$(scontrol show node "$NODE" 2>/dev/null | grep -o 'SlurmdStartTime=[^ ]*' | cut -d= -f2)
    [[ $started =~ ^[0-9] ]] && (($(date -d "$started" +%s) >= $1)) || return 0
    sinfo -h -N -n "$NODE" -o %T 2>/dev/null | head -n1
}

cmd_up() {
    [[ $EUID -eq 0 ]] || die "run as root"
    local t0=$SECONDS
    install -d -m 0755 "$LOG_DIR"
    install_pkgs
    start_munge
    write_conf
    # Always restart the slurm daemons, so that they read the config just
    # written. Job state survives in StateSaveLocation.
    stop_daemon slurmd
    stop_daemon slurmctld
    slurmctld || { show_logs; die "slurmctld failed to start, see $LOG_DIR/slurmctld.log"; }
    wait_for "scontrol ping 2>/dev/null | grep -q UP" 30 \
        || { show_logs; die "slurmctld does not answer (scontrol ping), see $LOG_DIR/slurmctld.log"; }
    local t_slurmd state="" i d
    t_slurmd=$(date +%s)
    slurmd || { show_logs; die "slurmd failed to start, see $LOG_DIR/slurmd.log"; }

    for ((i = 0; i < 60; i++)); do
        # Both daemons fork at once and may die later (port taken, bad config).
        for d in slurmctld slurmd; do
            pgrep -x "$d" >/dev/null || { show_logs; die "$d exited, see $LOG_DIR/$d.log"; }
        done
        state=$(node_state "$t_slurmd")
        # "idle", or "mixed"/"allocated" when jobs survived the restart;
        # a trailing * / ~ / # means "not responding" etc.
        [[ $state =~ ^(idle|mixed|allocated)$ ]] && break
        sleep 1
    done
    if ! [[ $state =~ ^(idle|mixed|allocated)$ ]]; then
        sinfo -N -l >&2 || true
        sinfo -R >&2 || true
        show_logs
        die "node $NODE is '${state:-not registered}', not idle, after 60 s; logs in $LOG_DIR"
    fi

    echo "slurm_local: smoke test: srun -N1 -n1 hostname"
    local out
    out=$(timeout 60 srun -N1 -n1 hostname) || { show_logs; die "srun failed, logs in $LOG_DIR"; }
    [[ $out == "$(hostname)" || $out == "$NODE" ]] || die "srun printed '$out', expected $NODE"

    echo "slurm_local: smoke test: sbatch --wrap"
    local dir job
    dir=$(mktemp -d /tmp/slurm_local.XXXXXX)
    # shellcheck disable=SC2016 # $SLURM_JOB_ID is expanded in the job.
    job=$(sbatch --parsable -o "$dir/%j.out" --wrap 'echo ok $SLURM_JOB_ID') \
        || { show_logs; die "sbatch failed, logs in $LOG_DIR"; }
    job=${job%%;*}
    # Poll the job ourselves: sbatch --wait polls at growing intervals (slow).
    # shellcheck disable=SC2015 # die if either the wait or the check fails.
    wait_for "scontrol show job $job | grep -qE 'JobState=(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY)'" 60 \
        && scontrol show job "$job" | grep -q 'JobState=COMPLETED' \
        || { scontrol show job "$job" >&2 || true; show_logs; die "sbatch job $job did not complete, logs in $LOG_DIR"; }
    grep -qx "ok $job" "$dir/$job.out" \
        || { cat "$dir/$job.out" >&2 || true; die "sbatch job $job: unexpected output in $dir/$job.out"; }
    rm -rf "$dir"

    local cpus mem
    read -r cpus mem < <(sinfo -h -N -n "$NODE" -o '%c %m')
    echo
    echo "SLURM is up: $(sinfo -V) with $(munged -V 2>&1 | cut -d' ' -f1) on node $NODE" \
        "(partition debug, $cpus CPUs, $mem MB RealMemory), config $CONF, logs in $LOG_DIR;" \
        "srun and sbatch smoke tests passed (job $job); 'up' took $((SECONDS - t0)) s."
}

cmd_down() {
    [[ $EUID -eq 0 ]] || die "run as root"
    stop_daemon slurmd
    stop_daemon slurmctld
    stop_daemon munged
    echo "slurm_local: slurmd, slurmctld, munged stopped"
}

cmd_status() {
    sinfo || die "slurmctld does not answer; start it with '$0 up', log: $LOG_DIR/slurmctld.log"
    squeue
}

case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
